//! The policy file's parser and checks, against files written inline.

use super::*;

const FULL: &str = r#"# oncebox policy
[tools.charge]
max_attempts = 5
initial_backoff = "100ms"
max_backoff = "5s"
attempt_deadline = "10s"
call_deadline = "1m"

[tools.charge.config]
base_url = "http://127.0.0.1:8080"
currency = "eur"

[tools.notify]
redispatch_in_doubt = false

[hosts."127.0.0.1:8080"]
honours_keys = true
key_retention = "24h"
timeout = "2s"

[hosts."mail.internal:25"]
timeout = "30s"
"#;

fn parse(text: &str) -> Result<PolicyFile, PolicyError> {
    PolicyFile::parse(text, Path::new("oncebox.toml"))
}

/// The line and reason of a refusal; panics on anything else so a test fails loudly.
fn refusal(result: Result<impl fmt::Debug, PolicyError>) -> (usize, String) {
    match result {
        Err(PolicyError::Invalid { path, line, reason }) => {
            assert_eq!(path, Path::new("oncebox.toml"));
            (line, reason)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn file_at(line: usize) -> Source {
    Source::File { path: PathBuf::from("oncebox.toml"), line }
}

#[test]
fn a_full_file_overrides_the_class_defaults_and_says_where() {
    let file = parse(FULL).expect("valid file");
    let eff = file.effective("charge", ReplayClass::Compensatable).expect("allowed");
    let defaults = RetryPolicy::for_class(ReplayClass::Compensatable);
    assert_eq!(
        eff.policy,
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            attempt_deadline: Duration::from_secs(10),
            call_deadline: Duration::from_secs(60),
            ..defaults
        }
    );
    assert_eq!(eff.source("max_attempts"), Some(&file_at(3)));
    assert_eq!(eff.source("initial_backoff"), Some(&file_at(4)));
    assert_eq!(eff.source("max_backoff"), Some(&file_at(5)));
    assert_eq!(eff.source("attempt_deadline"), Some(&file_at(6)));
    assert_eq!(eff.source("call_deadline"), Some(&file_at(7)));
    assert_eq!(eff.source("redispatch_in_doubt"), Some(&Source::ClassDefault(ReplayClass::Compensatable)));
    assert_eq!(eff.sources.len(), FIELDS.len());
    assert_eq!(file.tool_names(), vec!["charge".to_string(), "notify".to_string()]);
}

#[test]
fn sources_display_and_json() {
    let eff = parse(FULL).expect("valid").effective("charge", ReplayClass::Compensatable).expect("allowed");
    let json = eff.to_json();
    assert_eq!(json["policy"]["initial_backoff"], "100ms");
    assert_eq!(json["policy"]["call_deadline"], "1m");
    assert_eq!(json["policy"]["max_attempts"], 5);
    assert_eq!(json["sources"]["max_attempts"], "oncebox.toml:3");
    assert_eq!(json["sources"]["redispatch_in_doubt"], "default for compensatable");
    assert_eq!(serde_json::to_value(&eff).expect("serializes"), json);
}

#[test]
fn an_unknown_field_is_refused_with_its_line_and_name() {
    let (line, reason) = refusal(parse("[tools.x]\nmax_attempts = 2\nmax_retries = 4\n"));
    assert_eq!(line, 3);
    assert!(reason.contains("max_retries"), "{reason}");
    let (line, reason) = refusal(parse("[hosts.\"a:1\"]\n\ntimeout = \"1s\"\nretention = \"1s\"\n"));
    assert_eq!(line, 4);
    assert!(reason.contains("retention"), "{reason}");
    let (line, _) = refusal(parse("\n[tool.x]\n"));
    assert_eq!(line, 2);
}

#[test]
fn zero_or_too_many_attempts_are_refused() {
    let (line, reason) = refusal(parse("[tools.x]\n\nmax_attempts = 0\n"));
    assert_eq!(line, 3);
    assert!(reason.contains("at least 1"), "{reason}");
    let (line, _) = refusal(parse("[tools.x]\nmax_attempts = 101\n"));
    assert_eq!(line, 2);
    let (_, reason) = refusal(parse("[tools.x]\nmax_attempts = \"3\"\n"));
    assert!(reason.contains("integer"), "{reason}");
}

#[test]
fn negative_unparsable_and_zero_durations_are_refused() {
    let (line, reason) = refusal(parse("[tools.x]\ninitial_backoff = \"-5s\"\n"));
    assert_eq!(line, 2);
    assert!(reason.contains("negative"), "{reason}");
    let (line, reason) = refusal(parse("[tools.x]\nmax_attempts = 2\ncall_deadline = \"soon\"\n"));
    assert_eq!(line, 3);
    assert!(reason.contains("not a duration"), "{reason}");
    let (_, reason) = refusal(parse("[tools.x]\nattempt_deadline = \"0s\"\n"));
    assert!(reason.contains("more than zero"), "{reason}");
    let (_, reason) = refusal(parse("[hosts.\"h:80\"]\ntimeout = 5\n"));
    assert!(reason.contains("duration string"), "{reason}");
}

#[test]
fn backoffs_and_deadlines_must_be_ordered() {
    let (line, reason) = refusal(parse("[tools.x]\nmax_backoff = \"1s\"\ninitial_backoff = \"2s\"\n"));
    assert_eq!(line, 3);
    assert!(reason.contains("exceeds `max_backoff`"), "{reason}");
    let (line, _) = refusal(parse("[tools.x]\nattempt_deadline = \"2m\"\ncall_deadline = \"1m\"\n"));
    assert_eq!(line, 2);
    // One side from the class defaults: caught when the class is known.
    let file = parse("[tools.x]\ninitial_backoff = \"5s\"\n").expect("parses");
    let (line, reason) = refusal(file.effective("x", ReplayClass::ReadOnly));
    assert_eq!(line, 2);
    assert!(reason.contains("defaults"), "{reason}");
}

#[test]
fn irreversible_refuses_retries_other_classes_accept_them() {
    let file = parse("[tools.wire]\ninitial_backoff = \"1s\"\nmax_attempts = 3\n").expect("parses");
    let (line, reason) = refusal(file.effective("wire", ReplayClass::Irreversible));
    assert_eq!(line, 3);
    assert!(reason.contains("never retried automatically"), "{reason}");
    let eff = file.effective("wire", ReplayClass::IdempotentWrite).expect("allowed");
    assert_eq!(eff.policy.max_attempts, 3);

    let file = parse("[tools.wire]\n\nredispatch_in_doubt = true\n").expect("parses");
    let (line, _) = refusal(file.effective("wire", ReplayClass::Irreversible));
    assert_eq!(line, 3);
    // Tightening is always allowed, and saying the default again is not a loosening.
    let file = parse("[tools.wire]\nmax_attempts = 1\nredispatch_in_doubt = false\n").expect("parses");
    assert!(file.effective("wire", ReplayClass::Irreversible).is_ok());
}

#[test]
fn hosts_fill_defaults() {
    let hosts = parse(FULL).expect("valid").hosts();
    assert_eq!(
        hosts,
        vec![
            (
                "127.0.0.1:8080".to_string(),
                HttpTarget {
                    honours_keys: true,
                    key_retention: Duration::from_secs(24 * 3600),
                    timeout: Duration::from_secs(2),
                    ..HttpTarget::default()
                }
            ),
            ("mail.internal:25".to_string(), HttpTarget { timeout: Duration::from_secs(30), ..HttpTarget::default() }),
        ]
    );
}

#[test]
fn host_headers_are_credentials_kept_out_of_debug() {
    let file = parse("[hosts.\"h:80\".headers]\nAuthorization = \"Bearer s3cret\"\n").expect("valid");
    let hosts = file.hosts();
    assert_eq!(hosts[0].1.headers, [("authorization".to_string(), "Bearer s3cret".to_string())]);
    assert!(!format!("{:?}", hosts[0].1).contains("s3cret"));
    let (line, reason) = refusal(parse("[hosts.\"h:80\".headers]\nauthorization = 7\n"));
    assert_eq!(line, 2);
    assert!(reason.contains("must be a string"), "{reason}");
}

#[test]
fn key_retention_needs_honoured_keys_and_hosts_need_a_port() {
    let (line, reason) = refusal(parse("[hosts.\"h:80\"]\nhonours_keys = false\nkey_retention = \"1h\"\n"));
    assert_eq!(line, 3);
    assert!(reason.contains("honours_keys = true"), "{reason}");
    assert!(parse("[hosts.\"h:80\"]\nkey_retention = \"1h\"\n").is_err());
    let (line, reason) = refusal(parse("\n[hosts.\"http://h\"]\ntimeout = \"1s\"\n"));
    assert_eq!(line, 2);
    assert!(reason.contains("host:port"), "{reason}");
}

#[test]
fn config_is_string_pairs() {
    let file = parse(FULL).expect("valid");
    assert_eq!(
        file.config("charge"),
        vec![
            ("base_url".to_string(), "http://127.0.0.1:8080".to_string()),
            ("currency".to_string(), "eur".to_string())
        ]
    );
    assert!(file.config("notify").is_empty() && file.config("absent").is_empty());
    let (line, reason) = refusal(parse("[tools.x.config]\nretries = 3\n"));
    assert_eq!(line, 2);
    assert!(reason.contains("`retries` must be a string"), "{reason}");
    // Values stay out of Debug output: config often carries credentials.
    let debug = format!("{:?}", parse("[tools.x.config]\ntoken = \"s3cret\"\n").expect("parses"));
    assert!(debug.contains("token") && !debug.contains("s3cret"), "{debug}");
}

#[test]
fn a_syntax_error_names_its_line() {
    let (line, reason) = refusal(parse("[tools.x]\nmax_attempts = 2\ninitial_backoff = \"1s\n"));
    assert_eq!(line, 3);
    assert!(!reason.contains('\n'), "{reason}");
    let (line, _) = refusal(parse("[tools.x]\nmax_attempts = 2\nmax_attempts = 3\n"));
    assert_eq!(line, 3);
}

#[test]
fn no_file_means_class_defaults() {
    for class in
        [ReplayClass::ReadOnly, ReplayClass::IdempotentWrite, ReplayClass::Compensatable, ReplayClass::Irreversible]
    {
        let eff = PolicyFile::empty().effective("anything", class).expect("defaults are valid");
        assert_eq!(eff.policy, RetryPolicy::for_class(class));
        assert!(eff.sources.iter().all(|(_, s)| *s == Source::ClassDefault(class)));
    }
    assert!(PolicyFile::empty().hosts().is_empty() && PolicyFile::empty().tool_names().is_empty());
    let empty_text = parse("").expect("an empty file is valid");
    assert_eq!(
        empty_text.effective("x", ReplayClass::Compensatable).expect("ok").policy,
        RetryPolicy::for_class(ReplayClass::Compensatable)
    );
}

#[test]
fn load_reports_a_missing_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("oncebox.toml");
    assert!(matches!(PolicyFile::load(&missing), Err(PolicyError::Io { .. })));
    std::fs::write(&missing, FULL).expect("write");
    assert_eq!(PolicyFile::load(&missing).expect("loads").tool_names().len(), 2);
}

const SANDBOXED: &str = r#"[tools.charge.grants]
http = ["http://127.0.0.1:8080", "https://*.stripe.com"]
providers = ["bank"]

[tools.reserve.grants]
kv = ["reservations"]
outbox = ["stock-events"]
dirs = ["data:/data", "/var/cache/x:/cache:rw"]

[tools.reserve.limits]
memory = "16MiB"
effects = 10
stdio = 4096
"#;

#[test]
fn grants_and_limits_are_read_per_tool() {
    let file = PolicyFile::parse(SANDBOXED, Path::new("/etc/oncebox/oncebox.toml")).expect("valid");
    let charge = file.grants("charge");
    let url = |s: &str| url::Url::parse(s).expect("url");
    assert!(charge.check_http(&url("http://127.0.0.1:8080/v1/payments")).is_ok());
    assert!(charge.check_http(&url("https://api.stripe.com/v1")).is_ok());
    assert!(charge.check_http(&url("https://evil.example/")).is_err());
    assert!(charge.check_provider("bank").is_ok());
    assert!(charge.check_outbox("stock-events").is_err(), "grants are per tool");

    let reserve = file.grants("reserve");
    assert_eq!(reserve.kv, vec!["reservations".to_string()]);
    assert_eq!(reserve.dirs[0].host, Path::new("/etc/oncebox/data"), "relative to the policy file");
    assert!(!reserve.dirs[0].writable);
    assert_eq!(reserve.dirs[1].host, Path::new("/var/cache/x"));
    assert!(reserve.dirs[1].writable);

    let limits = file.limits("reserve");
    assert_eq!(limits.memory_bytes, 16 << 20);
    assert_eq!(limits.effects_per_attempt, 10);
    assert_eq!(limits.stdio_bytes, 4096);
    assert_eq!(limits.output_bytes, crate::limits::DEFAULT_OUTPUT_BYTES);
    assert_eq!(file.limits("charge"), crate::limits::Limits::default());
    assert_eq!(file.grants("stock"), Grants::default(), "a tool the file does not name gets nothing");
}

#[test]
fn bad_grants_and_limits_name_their_line() {
    let (line, reason) = refusal(parse("[tools.x.grants]\nhttp = \"https://a.example\"\n"));
    assert_eq!(line, 2);
    assert!(reason.contains("list of strings"), "{reason}");
    let (line, reason) = refusal(parse("[tools.x.grants]\nkv = []\nhttp = [\"https://a.example/path\"]\n"));
    assert_eq!(line, 3);
    assert!(reason.contains("more than an origin"), "{reason}");
    let (line, reason) = refusal(parse("[tools.x.grants]\nsockets = [\"*\"]\n"));
    assert_eq!(line, 2);
    assert!(reason.contains("sockets"), "{reason}");
    let (line, reason) = refusal(parse("[tools.x.limits]\nmemory = \"8GiB\"\n"));
    assert_eq!(line, 2);
    assert!(reason.contains("ceiling"), "{reason}");
    let (_, reason) = refusal(parse("[tools.x.limits]\nfuel = 5\n"));
    assert!(reason.contains("unknown limit `fuel`"), "{reason}");
    let (_, reason) = refusal(parse("[tools.x.limits]\neffects = \"10KiB\"\n"));
    assert!(reason.contains("must be an integer"), "{reason}");
}

const OUTBOX: &str = r#"[outbox.email]
endpoint = "https://hooks.example.com/email"
honours_keys = true
timeout = "3s"
initial_backoff = "50ms"
max_backoff = "2s"
attempts_per_pass = 7

[outbox.sms]
endpoint = "http://127.0.0.1:9000/sms"

[hosts."hooks.example.com:443"]
headers = { authorization = "Bearer sk_hook" }
"#;

#[test]
fn outbox_topics_get_their_endpoints_with_defaults_and_their_hosts_credentials() {
    let file = parse(OUTBOX).expect("valid");
    let endpoints: BTreeMap<String, crate::delivery::Endpoint> = file.outbox_endpoints().into_iter().collect();
    let email = &endpoints["email"];
    assert_eq!(email.url.as_str(), "https://hooks.example.com/email");
    assert!(email.honours_keys);
    assert_eq!(
        (email.timeout, email.initial_backoff, email.max_backoff, email.attempts_per_pass),
        (Duration::from_secs(3), Duration::from_millis(50), Duration::from_secs(2), 7)
    );
    assert_eq!(email.headers, vec![("authorization".to_string(), "Bearer sk_hook".to_string())]);
    let sms = &endpoints["sms"];
    let defaults = crate::delivery::Endpoint::new(sms.url.clone());
    assert_eq!(sms, &defaults, "unset fields take the defaults; no credentials for another host");
    assert!(!sms.honours_keys, "keys are not trusted unless declared");
    assert!(!format!("{file:?}").contains("sk_hook"), "credentials stay out of Debug");
}

#[test]
fn bad_outbox_sections_name_their_line() {
    let cases: [(&str, usize, &str); 9] = [
        ("[outbox.email]\nhonours_keys = true\n", 1, "needs `endpoint"),
        ("[outbox.email]\nendpoint = 5\n", 2, "must be a URL string"),
        ("[outbox.email]\nendpoint = \"ftp://x/y\"\n", 2, "http or https"),
        ("[outbox.email]\nendpoint = \"not a url\"\n", 2, "`endpoint = \"not a url\"`"),
        ("[outbox.email]\nendpoint = \"http://u:p@h:1/\"\n", 2, "may not carry credentials"),
        ("[outbox.email]\nendpoint = \"http://h:1/\"\ntimeout = \"0s\"\n", 3, "more than zero"),
        ("[outbox.email]\nendpoint = \"http://h:1/\"\ninitial_backoff = \"1m\"\n", 3, "exceeds `max_backoff`"),
        ("[outbox.email]\nendpoint = \"http://h:1/\"\nattempts_per_pass = 0\n", 3, "from 1 to"),
        ("[outbox.email]\nendpoint = \"http://h:1/\"\nretries = 3\n", 3, "unknown field `retries`"),
    ];
    for (text, line, reason) in cases {
        let (got_line, got_reason) = refusal(parse(text));
        assert_eq!(got_line, line, "{text}: {got_reason}");
        assert!(got_reason.contains(reason), "{text}: {got_reason}");
    }
}

#[test]
fn the_reconciler_is_on_by_default_and_its_table_overrides_each_setting() {
    let defaults = crate::reconcile_schedule::Settings::default();
    assert!(defaults.enabled);
    assert_eq!(parse(FULL).expect("valid").reconciler(), defaults, "no [reconciler]: the defaults");
    assert_eq!(PolicyFile::empty().reconciler(), defaults);
    let file =
        parse("[reconciler]\nenabled = false\nfirst = \"250ms\"\nmax = \"1m\"\nevery = \"5s\"\n").expect("valid");
    assert_eq!(
        file.reconciler(),
        crate::reconcile_schedule::Settings {
            enabled: false,
            first: Duration::from_millis(250),
            max: Duration::from_secs(60),
            every: Duration::from_secs(5),
        }
    );
    let partial = parse("[reconciler]\nmax = \"10s\"\n").expect("valid").reconciler();
    assert_eq!((partial.first, partial.max, partial.every), (defaults.first, Duration::from_secs(10), defaults.every));
}

#[test]
fn bad_reconciler_settings_name_their_line() {
    let cases = [
        ("[reconciler]\nenabled = \"yes\"\n", 2, "`enabled` must be true or false"),
        ("[reconciler]\nfirst = \"0s\"\n", 2, "`first` must be more than zero"),
        ("[reconciler]\n\nmax = 5\n", 3, "`max` must be a duration string"),
        ("[reconciler]\nevery = \"soon\"\n", 2, "`every = \"soon\"` is not a duration"),
        ("[reconciler]\nevery = \"-2s\"\n", 2, "cannot be negative"),
        ("[reconciler]\nfirst = \"10m\"\nmax = \"1m\"\n", 2, "`first` (10m) exceeds `max` (1m, line 3)"),
        ("[reconciler]\nfirst = \"1h\"\n", 2, "exceeds `max` (5m, its default filled in)"),
        ("[reconciler]\nmax = \"100ms\"\n", 2, "`first` (1s) exceeds `max` (100ms"),
        ("[reconciler]\nenabled = true\nbackoff = \"1s\"\n", 3, "unknown field `backoff`"),
    ];
    for (text, line, reason) in cases {
        let (at, why) = refusal(parse(text));
        assert_eq!(at, line, "{text}: {why}");
        assert!(why.contains(reason), "{text}: {why}");
    }
}

#[test]
fn notify_signs_each_url_through_a_reserved_outbox_topic() {
    let file = parse(
        r#"
[notify]
urls = ["https://hooks.example.com/oncebox", "http://127.0.0.1:9100/x"]
secret = "0123456789abcdef0123456789abcdef"
unknown_after = "0s"
"#,
    )
    .expect("parse");
    let notify = file.notify().expect("[notify]");
    assert_eq!(notify.unknown_after, Duration::ZERO);
    let topics = file.outbox_endpoints();
    assert_eq!(topics.len(), 2);
    assert!(topics.iter().all(|(topic, e)| crate::notice::reserved(topic) && e.signing.is_some() && e.honours_keys));
    assert!(!format!("{notify:?}").contains("0123456789abcdef"), "the secret is never printed");
    assert_eq!(parse("").expect("parse").notify(), None);

    let (line, reason) = refusal(parse("[notify]\nurls = [\"http://127.0.0.1:1/\"]\nsecret = \"short\"\n"));
    assert_eq!(line, 3);
    assert!(reason.contains("at least 32 bytes"), "{reason}");
    let (_, reason) = refusal(parse("[notify]\nsecret = \"0123456789abcdef0123456789abcdef\"\n"));
    assert!(reason.contains("needs `urls`"), "{reason}");
    let (_, reason) = refusal(parse("[notify]\nurls = [\"http://127.0.0.1:1/\"]\n"));
    assert!(reason.contains("needs `secret"), "{reason}");
    // No tool may enqueue where the host's signed messages go.
    let (line, reason) = refusal(parse("[tools.t.grants]\noutbox = [\"oncebox/notify x\"]\n"));
    assert_eq!(line, 2);
    assert!(reason.contains("the host's own"), "{reason}");
    let (_, reason) = refusal(parse("[outbox.\"oncebox/x\"]\nendpoint = \"http://127.0.0.1:1/\"\n"));
    assert!(reason.contains("the host's own"), "{reason}");
}
