//! The session settings every connection of the ledger starts with: libpq's `options`, the
//! server's command-line switches (`-c name=value`, `--name=value`), with the ledger's defaults
//! added where the URL sets none of its own.

/// `url_options` (the URL's `options`, if any) with the ledger's settings added.
pub(super) fn session(url_options: Option<&str>) -> String {
    let mut options = url_options.unwrap_or_default().trim().to_string();
    // A host that stalls inside a transaction (hung, partitioned with its socket open) loses it,
    // and the locks it holds on other hosts' operations, after a minute.
    if !sets(&options, "idle_in_transaction_session_timeout") {
        options.push_str(" -c idle_in_transaction_session_timeout=60000");
    }
    // A lone group job waits for its locks as long as it takes (`group.rs`).
    if !sets(&options, "lock_timeout") {
        options.push_str(" -c lock_timeout=0");
    }
    // The groups' statements take arrays of any length, and their best plan does not depend on
    // the values: planning them once per connection (a generic plan) instead of at every
    // execution saves a good part of the server's time per group. Every other statement looks
    // rows up by a key, or by a run, with no condition a generic plan could not index.
    if !sets(&options, "plan_cache_mode") {
        options.push_str(" -c plan_cache_mode=force_generic_plan");
    }
    // A plan is made once, perhaps while the tables hold a few rows, and kept as they grow (until
    // the server analyzes them again): one that reads a small table whole stays so. Every
    // statement of the ledger looks its rows up by a key (`writes.rs`) or lists them in a key's
    // order, both an index's work, and this keeps the planner to its indexes.
    if !sets(&options, "enable_seqscan") {
        options.push_str(" -c enable_seqscan=off");
    }
    // Durable before answered, whatever the URL or the server says (riding claims and answers ask
    // for otherwise one transaction at a time: `group.rs`).
    options.push_str(" -c synchronous_commit=on");
    // The schema this host writes, which the database's guard asks of every write of the tables
    // the index follows (`schema.rs`): set here, whatever the URL says.
    options.push_str(&format!(" -c {}={}", super::schema::SESSION_SCHEMA, super::schema::SCHEMA_VERSION));
    options.trim_start().to_string()
}

/// Whether `options` set the setting `name` (lower case, words joined by `_`): as the server reads
/// them, names are case-insensitive and `--a-name=` is `a_name`.
fn sets(options: &str, name: &str) -> bool {
    let mut words = options.split_whitespace();
    while let Some(word) = words.next() {
        let setting = match word {
            "-c" => words.next(),
            _ => word.strip_prefix("--").or_else(|| word.strip_prefix("-c")),
        };
        let Some(setting) = setting else { continue };
        let set = setting.split('=').next().unwrap_or_default();
        if set.to_ascii_lowercase().replace('-', "_") == name {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::{session, sets};

    #[test]
    fn a_setting_is_found_however_the_url_spells_it_and_only_that_setting() {
        for options in ["-c lock_timeout=5s", "-clock_timeout=5s", "--lock-timeout=5s", "-c Lock_Timeout=5s"] {
            assert!(sets(options, "lock_timeout"), "{options}");
        }
        for options in ["-c deadlock_timeout=2s", "-c idle_in_transaction_session_timeout=1", "", "lock_timeout"] {
            assert!(!sets(options, "lock_timeout"), "{options}");
        }
    }

    #[test]
    fn the_url_keeps_its_settings_and_the_ledger_adds_the_rest() {
        let made = session(Some("-c Lock_Timeout=200 -c deadlock_timeout=2s"));
        assert!(made.starts_with("-c Lock_Timeout=200 -c deadlock_timeout=2s"), "{made}");
        assert!(!made.contains("lock_timeout=0"), "{made}");
        assert!(made.contains("-c idle_in_transaction_session_timeout=60000"), "{made}");
        assert!(made.contains("-c plan_cache_mode=force_generic_plan -c enable_seqscan=off"), "{made}");
        assert!(made.ends_with("-c synchronous_commit=on -c oncebox.schema=2"), "{made}");
        let none = session(None);
        assert!(none.starts_with("-c idle_in_transaction_session_timeout=60000 -c lock_timeout=0"), "{none}");
    }
}
