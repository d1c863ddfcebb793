//! Errors of the library's public operations. Each names what went wrong and where; who is to
//! blame (the caller's input, the tool, the host) follows from the variant.

pub use crate::ledger::LedgerError;
use crate::policy::ReplayClass;
pub use crate::runtime::LoadError;

/// Why a call could not run. Failures of the tool itself are not errors: they are outcomes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    #[error("no tool named `{tool}` is loaded (loaded: {loaded})")]
    UnknownTool { tool: String, loaded: String },
    #[error("invalid args for `{tool}`: {reason}")]
    InvalidArgs { tool: String, reason: String },
    #[error(
        "`{tool}` is {class}: it can change the world, so it needs a run id and a step id from the \
         orchestrator (--run and --step); without them a retry could not be told from a new intent"
    )]
    StepRequired { tool: String, class: ReplayClass },
    #[error(
        "step `{step_id}` is refused: step ids that begin with `{}` are the saga's own, one per step it \
         undoes; name the step otherwise",
        crate::keys::COMPENSATION_PREFIX
    )]
    ReservedStep { step_id: String },
    /// A run or step id that cannot name anything (`keys::id_refused`); nothing was recorded.
    #[error("{reason}")]
    InvalidId { reason: String },
    #[error("cannot settle the operation: {reason}")]
    InvalidResolution { reason: String },
    /// A person's word that they undid a step by hand, refused (`saga::undone_by_hand`): nothing
    /// was recorded.
    #[error("cannot record operation {operation_key} undone by hand: {reason}")]
    ByHand { operation_key: String, reason: String },
    #[error("cannot decide the approval of operation {operation_key}: {reason}")]
    Approval { operation_key: String, reason: String },
    /// The host could not seal a call's sensitive values (no randomness): nothing was recorded.
    #[error("the sensitive values of operation {operation_key} could not be sealed: {reason}; nothing was run")]
    Seal { operation_key: String, reason: String },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// Every error of the library, for callers that do not care which operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Call(#[from] CallError),
    #[error(transparent)]
    Policy(#[from] crate::policy_file::PolicyError),
    #[error(transparent)]
    Key(#[from] crate::secret::KeyFileError),
    #[error("cannot build the HTTP client: {0}")]
    HttpClient(String),
    #[error("the retry policy set in code for `{tool}` ({class}) is refused: {violation}")]
    PolicyRefused { tool: String, class: ReplayClass, violation: crate::policy::Violation },
    #[error("a tool named `{name}` is already loaded from {existing}")]
    DuplicateTool { name: String, existing: String },
}
