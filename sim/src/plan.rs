//! What a seed stands for: the workload (orders and single calls, shared among callers), the
//! downstream's character and the mix of its answers, the crashes and the operator's habits. A
//! pure function of the seed; its digest is printed so that two runs of a seed can be compared.
//!
//! The world's choices made while a seed runs (what one dispatch meets, what the operator decides
//! of one request) are drawn by [`choice`] from the seed and the names of what they concern (the
//! route, the order, the dispatch's number), never from the order in which tasks happened to run.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The SKUs the orders reserve: few, so that reservations of different orders meet on a counter.
pub const SKUS: [&str; 2] = ["sku-a", "sku-b"];

/// The workload and the world of one seed.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub seed: u64,
    /// Concurrent callers (orchestrators).
    pub callers: usize,
    pub downstream: Downstream,
    pub jobs: Vec<Job>,
    /// One per life of the host, in order: the host of life `n` crashes at `crashes[n]`; the
    /// lives after the last crash run to the end.
    pub crashes: Vec<Crash>,
    pub operator: Operator,
    /// The ledger's calls awaited as a host awaits them, other tasks running meanwhile: races
    /// inside the store (a decision being written while a claim is taken) become possible, and
    /// the run is no longer deterministic (see `paced.rs`). A quarter of the seeds.
    pub free: bool,
    /// Percent of the writes of decisions on requests for approval held back inside the store,
    /// after their mark and before their write, until a claim of their step has opened its
    /// snapshot or a few ms have passed (`race.rs`): a race inside the store on the seed's
    /// schedule, where a `free` seed meets one only by luck.
    pub holds_pct: u64,
    /// When the operator deploys the other build of `charge` (ms into a life): one naming
    /// another refund tool (`refun2`), or back (`drive/upgrade.rs`).
    pub upgrades: Vec<u64>,
    /// Percent of the pipeline's points a caller's call reaches at which it stops dead (its
    /// process paused, alive) for longer than its lease, while another worker of its
    /// orchestrator takes the step over; then it resumes (`pause.rs`). At most two per seed.
    pub pause_pct: u64,
    /// The retention the operator's `gc` runs with: mostly longer than the seed's lives (it
    /// collects nothing), on some seeds none at all or a second or two, so that gc removes what
    /// ended, at any moment: at the plan's times, and as a request is about to be written ahead
    /// or has just been answered.
    pub gc_retention_ms: u64,
    /// Steps of the host's wall clock (ms into a life, by how many ms, forward or back), on a
    /// quarter of the seeds: within what the host's margins absorb (see sim/README.md).
    pub clock_jumps: Vec<(u64, i64)>,
    /// Percent, drawn at each of the two points an unfavourable answer reaches (anything but a
    /// 2xx: a refusal, a 429, a 5xx, a refused connection, no answer; so about half of such
    /// answers at 30, five in six at 60), at which the caller's process stops dead, as
    /// `pause_pct`'s do, at the moment the answer reaches the host (before its record, or after
    /// it and before the attempt's): the load that makes a downstream turn a host away stalls
    /// the host too. What the answer proved must then be judged by whoever takes the step over,
    /// from what the stopped attempt left. At most two per seed, beside `pause_pct`'s.
    pub stall_after_fault_pct: u64,
}

/// What the downstream is like, and how it answers.
#[derive(Debug, Clone, Serialize)]
pub struct Downstream {
    /// It deduplicates by `Idempotency-Key` (and the host is told so).
    pub honours_keys: bool,
    /// It forgets a key this long after the key's commit (and the host is told so).
    pub key_retention_ms: u64,
    /// The host's timeout.
    pub timeout_ms: u64,
    /// How long a request it took can still commit, as the host is told (`settle_window`); its
    /// late commits and lagging lookups stay within it, as its contract says.
    pub settle_window_ms: u64,
    /// A lookup by key sees a commit only this long after it.
    pub lookup_lag_ms: u64,
    /// What a request meets, by weight.
    pub answers: Vec<(Answer, u32)>,
    /// Percent of lookups (reconcile's GET by key) that fail with a 503.
    pub lookup_fail_pct: u64,
    /// Percent of reads (the inventory) that fail with a 503.
    pub read_fail_pct: u64,
    /// Percent of resends of a committed key answered with a refusal ("already processed")
    /// instead of the commit's answer: a refusal after a commit, which proves nothing.
    pub resend_refused_pct: u64,
}

/// What one request meets at the downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Answer {
    /// Commits and answers 2xx at once.
    Ok,
    /// Commits and answers 2xx, slowly but within the host's timeout.
    Slow,
    /// Commits, then answers 502 (a gateway that lost the origin's answer).
    CommitThen502,
    /// Commits; the answer is lost (the host times out).
    LostResponse,
    /// Takes the request, answers nothing before the host gives up, and commits later.
    CommitLate,
    /// Answers 503 without committing (the host cannot know that).
    Fail503,
    /// 429 with a retry-after, nothing committed.
    RateLimited,
    /// A definitive no (402 for a payment, 400 otherwise), nothing committed.
    Refused,
    /// The connection is refused: nothing was sent.
    NotConnected,
}

impl Answer {
    pub const ALL: [Answer; 9] = [
        Answer::Ok,
        Answer::Slow,
        Answer::CommitThen502,
        Answer::LostResponse,
        Answer::CommitLate,
        Answer::Fail503,
        Answer::RateLimited,
        Answer::Refused,
        Answer::NotConnected,
    ];

    /// Whether the downstream did (or will do) the work.
    pub fn commits(self) -> bool {
        matches!(self, Answer::Ok | Answer::Slow | Answer::CommitThen502 | Answer::LostResponse | Answer::CommitLate)
    }

    /// Whether this answer is a fault (anything but a prompt success).
    pub fn is_fault(self) -> bool {
        !matches!(self, Answer::Ok | Answer::Slow)
    }
}

/// A unit of work one caller (or two, racing) carries out.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "job", rename_all = "kebab-case")]
pub enum Job {
    /// The order workflow: stock, reserve, charge, fulfill (approved by the operator), notify; a
    /// failed or rejected step (or a cancelled order, after its charge) compensates the run.
    Order {
        run: String,
        order: String,
        sku: String,
        quantity: u64,
        amount_cents: u64,
        cancel: bool,
        /// Who runs it: two callers run the same steps at once (an orchestrator retrying while its
        /// first try still runs).
        callers: Vec<usize>,
    },
    /// One call of one tool, made `repeats` times (a repeat is the same step: answered from the
    /// ledger), the last repeat with other args when `conflicting` (refused, nothing sent).
    Call { run: String, step: String, tool: String, args: Value, repeats: u32, conflicting: bool, caller: usize },
}

impl Job {
    pub fn callers(&self) -> Vec<usize> {
        match self {
            Job::Order { callers, .. } => callers.clone(),
            Job::Call { caller, .. } => vec![*caller],
        }
    }
}

/// Where the host of one life dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "crash", rename_all = "kebab-case")]
pub enum Crash {
    /// At the `visit`-th crash point the pipeline reaches (before or after a write-ahead, a
    /// dispatch, an answer, an attempt's record).
    AtPoint { visit: u32 },
    /// Wherever it is `after_ms` into its life: in a ledger write, an instance, a backoff.
    AtTime { after_ms: u64 },
}

/// The operator's habits.
#[derive(Debug, Clone, Serialize)]
pub struct Operator {
    /// How often the operator looks (simulated ms).
    pub every_ms: u64,
    /// How long the operator leaves between two rounds of reconciling (0: every look): an
    /// operator who is away lets proofs age, as a key's retention runs out.
    pub reconcile_every_ms: u64,
    /// Percent of requests for approval rejected.
    pub reject_pct: u64,
    /// Percent of approvals followed at once by a second person's rejection, racing the call.
    pub racing_reject_pct: u64,
    /// Percent of looks that compensate an order run still going (a person undoing it midway).
    pub compensate_pct: u64,
    /// Component reloads: (ms into a life, tool).
    pub reloads: Vec<(u64, String)>,
    /// `gc` runs (ms into a life), with a retention longer than the workload.
    pub gcs: Vec<u64>,
}

/// What a shrunk run leaves out of its seed's plan: jobs and crashes, by their index in the plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cut {
    pub jobs: BTreeSet<usize>,
    pub crashes: BTreeSet<usize>,
}

impl Cut {
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.crashes.is_empty()
    }

    /// The command-line flags that make the same cut.
    pub fn flags(&self) -> String {
        let list = |set: &BTreeSet<usize>| set.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        let mut flags = String::new();
        if !self.jobs.is_empty() {
            flags.push_str(&format!(" --drop-jobs {}", list(&self.jobs)));
        }
        if !self.crashes.is_empty() {
            flags.push_str(&format!(" --drop-crashes {}", list(&self.crashes)));
        }
        flags
    }
}

/// A number drawn from the seed and `parts`, the same whenever they are.
pub fn choice(seed: u64, parts: &[&str]) -> u64 {
    let mut hash = Sha256::new();
    hash.update(seed.to_le_bytes());
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// Percent (0..100) drawn like [`choice`].
pub fn percent(seed: u64, parts: &[&str]) -> u64 {
    choice(seed, parts) % 100
}

/// The largest step of the host's clock a seed makes: below the margin a lookup's proof keeps
/// over the longest late commit (the send deadline, 1 s, plus the host's timeout), so that a
/// forward step never turns an empty lookup into proof while the request can still commit.
pub const MAX_JUMP_MS: i64 = 800;

/// The tools the simulated workload calls (each loaded from `oncebox-artifacts`).
pub const TOOLS: [&str; 7] = ["stock", "reserve", "release", "charge", "refund", "fulfill", "notify"];

impl Plan {
    /// The plan of `seed`.
    pub fn new(seed: u64) -> Plan {
        let mut rng = fastrand::Rng::with_seed(seed);
        let callers = rng.usize(2..=4);
        let downstream = Downstream::draw(&mut rng);
        let orders = rng.usize(3..=7);
        let singles = rng.usize(2..=8);
        let mut jobs = Vec::new();
        for n in 0..orders {
            let first = rng.usize(0..callers);
            let mut who = vec![first];
            if rng.u64(0..100) < 25 {
                who.push((first + 1 + rng.usize(0..callers - 1)) % callers);
            }
            jobs.push(Job::Order {
                run: format!("run-{n}"),
                order: format!("o-{n}"),
                sku: SKUS[rng.usize(0..SKUS.len())].to_string(),
                quantity: rng.u64(1..=3),
                amount_cents: 100 * rng.u64(1..=50),
                cancel: rng.u64(0..100) < 15,
                callers: who,
            });
        }
        for n in 0..singles {
            jobs.push(single(&mut rng, n, callers));
        }
        rng.shuffle(&mut jobs);
        let crashes = (0..rng.usize(0..=3))
            .map(|_| match rng.bool() {
                true => Crash::AtPoint { visit: rng.u32(1..=40) },
                false => Crash::AtTime { after_ms: rng.u64(1..=3_000) },
            })
            .collect();
        let reloads =
            (0..rng.usize(0..=2)).map(|_| (rng.u64(0..2_000), TOOLS[rng.usize(0..TOOLS.len())].to_string())).collect();
        let gcs = (0..rng.usize(0..=2)).map(|_| rng.u64(0..3_000)).collect();
        let operator = Operator {
            every_ms: rng.u64(20..=200),
            reconcile_every_ms: [0, 1_500, 4_000][rng.usize(0..3)],
            reject_pct: rng.u64(0..=30),
            racing_reject_pct: rng.u64(0..=40),
            compensate_pct: rng.u64(0..=5),
            reloads,
            gcs,
        };
        let free = rng.u64(0..100) < 25;
        // Drawn after the rest, so that the rest stays as it was before these were drawn.
        let holds_pct = [0, 30, 70][rng.usize(0..3)];
        let upgrades = (0..rng.usize(0..=2)).map(|_| rng.u64(0..3_000)).collect();
        let pause_pct = [0, 0, 3, 10][rng.usize(0..4)];
        let gc_retention_ms = [600_000, 600_000, 0, 1_500][rng.usize(0..4)];
        let clock_jumps = match rng.u64(0..4) {
            0 => (0..rng.usize(1..=2))
                .map(|_| (rng.u64(0..3_000), rng.i64(MAX_JUMP_MS / 20..=MAX_JUMP_MS) * [1, -1][rng.usize(0..2)]))
                .collect(),
            _ => Vec::new(),
        };
        let stall_after_fault_pct = [0, 0, 30, 60][rng.usize(0..4)];
        // Payments by a tool that runs past its deadline once its request is answered (after the
        // others in the job list, so that theirs keep their places: `--drop-jobs`).
        // A quarter of the seeds: each such call is answered `unknown` until the operator settles
        // it by hand, asked again meanwhile (half the seeds cost the CI run a third more).
        let overruns = match rng.u64(0..4) {
            0 => rng.usize(1..=2),
            _ => 0,
        };
        for n in singles..singles + overruns {
            jobs.push(overrun(&mut rng, n, callers));
        }
        Plan {
            seed,
            callers,
            downstream,
            jobs,
            crashes,
            operator,
            free,
            holds_pct,
            upgrades,
            pause_pct,
            gc_retention_ms,
            clock_jumps,
            stall_after_fault_pct,
        }
    }

    /// The plan without the jobs and crashes `cut` names (the world's choices stay the seed's:
    /// they are drawn by name, not by position).
    pub fn without(&self, cut: &Cut) -> Plan {
        let mut plan = self.clone();
        plan.jobs =
            self.jobs.iter().enumerate().filter(|(n, _)| !cut.jobs.contains(n)).map(|(_, j)| j.clone()).collect();
        plan.crashes =
            self.crashes.iter().enumerate().filter(|(n, _)| !cut.crashes.contains(n)).map(|(_, c)| *c).collect();
        plan
    }

    /// SHA-256 of the plan as JSON: equal digests, equal workloads and fault schedules.
    pub fn digest(&self) -> String {
        let text = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(&text))
    }

    /// The orders of the workload (order workflow runs and single calls), by order id: the
    /// checker's index of what each order's effects should be.
    pub fn order_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .jobs
            .iter()
            .filter_map(|job| match job {
                Job::Order { order, .. } => Some(order.clone()),
                Job::Call { args, .. } => order_in(args).map(str::to_string),
            })
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }
}

impl Downstream {
    fn draw(rng: &mut fastrand::Rng) -> Downstream {
        let settle_window_ms = rng.u64(1_000..=5_000);
        // Mostly a good downstream with some faults; some seeds a very bad one.
        let bad = rng.u64(0..100) < 30;
        let answers = Answer::ALL
            .iter()
            .map(|&answer| {
                let weight = match answer {
                    Answer::Ok => 60,
                    Answer::Slow => 10,
                    _ if bad => rng.u32(5..=25),
                    _ => rng.u32(0..=6),
                };
                (answer, weight)
            })
            .collect();
        Downstream {
            honours_keys: rng.u64(0..100) < 75,
            // Short enough, on the simulated clock, that some keys are forgotten within a seed.
            key_retention_ms: [1_000, 2_000, 30_000, 86_400_000][rng.usize(0..4)],
            timeout_ms: 200,
            settle_window_ms,
            lookup_lag_ms: rng.u64(0..=settle_window_ms / 2),
            answers,
            lookup_fail_pct: rng.u64(0..=20),
            read_fail_pct: rng.u64(0..=20),
            resend_refused_pct: rng.u64(0..=30),
        }
    }

    /// What the `nth` dispatch (1 = the first) of `route`'s request for `order` meets.
    pub fn answer(&self, seed: u64, route: &str, order: &str, nth: u32) -> Answer {
        let total: u64 = self.answers.iter().map(|(_, w)| u64::from(*w)).sum();
        let mut pick = choice(seed, &["answer", route, order, &nth.to_string()]) % total.max(1);
        for (answer, weight) in &self.answers {
            if pick < u64::from(*weight) {
                return *answer;
            }
            pick -= u64::from(*weight);
        }
        Answer::Ok
    }
}

/// A single call of one tool (its own run), with args that keep its order apart from the others.
fn single(rng: &mut fastrand::Rng, n: usize, callers: usize) -> Job {
    let order = format!("x-{n}");
    let sku = SKUS[rng.usize(0..SKUS.len())];
    let (tool, args) = match rng.usize(0..7) {
        0 => ("stock", json!({"sku": sku})),
        1 => ("charge", charge_args(&order, 100 * rng.u64(1..=50))),
        2 => ("refund", json!({"order_id": order, "amount_cents": 100 * rng.u64(1..=50)})),
        3 => ("notify", notify_args(&order)),
        4 => ("reserve", json!({"order_id": order, "sku": sku, "quantity": rng.u64(1..=3)})),
        5 => ("release", json!({"order_id": order})),
        _ => ("fulfill", fulfill_args(&order, sku, rng.u64(1..=3))),
    };
    Job::Call {
        run: format!("call-{n}"),
        step: "only".into(),
        tool: tool.into(),
        args,
        repeats: rng.u32(1..=3),
        conflicting: rng.u64(0..100) < 20,
        caller: rng.usize(0..callers),
    }
}

/// The tool that runs past its deadline after its effect: `panicky` (a test tool of the host's),
/// which POSTs its `post` as an effect and then spins, never returning. Its attempt deadline in
/// the simulation (`drive::OVERRUN_DEADLINE`) is spent on the simulated clock.
pub const OVERRUN_TOOL: &str = "panicky";

/// A single call of [`OVERRUN_TOOL`] (its own run and order, like [`single`]'s): a payment it
/// posts to the downstream's `/payments`, after whose answer it spins past its deadline on every
/// attempt. The host must never call such an operation failed while its payment may stand.
fn overrun(rng: &mut fastrand::Rng, n: usize, callers: usize) -> Job {
    let order = format!("x-{n}");
    let payment = json!({"order_id": order, "amount_cents": 100 * rng.u64(1..=50)});
    let args = json!({"mode": "spin", "post": {"url": format!("{}/payments", crate::world::ORIGIN), "body": payment}});
    Job::Call {
        run: format!("call-{n}"),
        step: "only".into(),
        tool: OVERRUN_TOOL.into(),
        args,
        repeats: rng.u32(1..=2),
        conflicting: false,
        caller: rng.usize(0..callers),
    }
}

/// The order a tool's args concern: their `order_id`, or that of the body an
/// [`OVERRUN_TOOL`] call posts.
pub fn order_in(args: &Value) -> Option<&str> {
    args.get("order_id").or_else(|| args.pointer("/post/body/order_id")).and_then(Value::as_str)
}

pub fn charge_args(order: &str, amount_cents: u64) -> Value {
    json!({"order_id": order, "amount_cents": amount_cents, "currency": "eur", "payment_method": format!("pm_card_{order}")})
}

pub fn fulfill_args(order: &str, sku: &str, quantity: u64) -> Value {
    json!({"order_id": order, "address": format!("{order} Main Street"), "items": [{"sku": sku, "quantity": quantity}]})
}

pub fn notify_args(order: &str) -> Value {
    json!({"order_id": order, "email": format!("{order}@example.com"), "template": "shipped"})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_is_its_plan_and_another_seed_is_another() {
        assert_eq!(Plan::new(7).digest(), Plan::new(7).digest());
        assert_ne!(Plan::new(7).digest(), Plan::new(8).digest());
    }

    #[test]
    fn an_answer_depends_on_what_it_concerns_not_on_when_it_is_asked() {
        let plan = Plan::new(3);
        let first = plan.downstream.answer(3, "payments", "o-1", 1);
        for _ in 0..3 {
            assert_eq!(plan.downstream.answer(3, "payments", "o-1", 1), first);
        }
        let spread: std::collections::HashSet<Answer> =
            (1..200).map(|n| plan.downstream.answer(3, "payments", "o-1", n)).collect();
        assert!(spread.len() > 1, "the dispatches of one request meet more than one answer: {spread:?}");
    }
}
