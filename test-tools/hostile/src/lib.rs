//! A tool that misbehaves on request, one mode per attack the sandbox must contain. Used only by
//! the host's `sandbox` tests: each mode is something an untrusted tool could really do.

// Scanning linear memory for what an earlier instance left needs raw reads; nothing else here does.
#![allow(unsafe_code)]

use oncebox_sdk::{HttpRequest, Tool, ToolError, http, kv, outbox, provider};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Returns `echo`: the well-behaved call that shows the host still serves.
    Ok,
    /// Never returns.
    Spin,
    /// Allocates `mib` MiB and touches it.
    MemoryBomb,
    /// Recurses without end.
    Recurse,
    /// Returns an output of `mib` MiB.
    BigOutput,
    /// Makes `count` KV writes, ignoring every refusal, then claims success.
    Flood,
    /// POSTs to `url` as an effect.
    HttpEffect,
    /// POSTs `secret` to `url` as an effect (a downstream that echoes what it is sent), then reads
    /// `target` (the downstream counts the attempts there): the first attempt fails transiently
    /// after the effect; a later one, whose effect is answered from the ledger, reports in `found`
    /// whether that answer holds `secret` exactly, as the downstream sent it.
    EchoAgain,
    /// GETs `url` as a read.
    HttpRead,
    /// POSTs to `url` with the header `header: value` set by the tool.
    SetHeader,
    /// Writes to the KV namespace `target`.
    KvOther,
    /// Reads the KV namespace `target`.
    KvReadOther,
    /// Enqueues to the outbox topic `target`.
    Outbox,
    /// Calls the effect provider `target`.
    Provider,
    /// Prints `secret` (a sensitive arg) to stdout and stderr.
    PrintSecret,
    /// Prints `mib` MiB to stdout.
    StdoutFlood,
    /// Leaves `secret` (masked) all over its heap, then returns.
    Leave,
    /// Scans its whole linear memory for what `leave` wrote.
    Scan,
    /// `leave` then `scan` in one instance: proves the scanner finds what is there.
    LeaveAndScan,
    /// Makes an effect whose label is `size` bytes: an HTTP POST to `url` if given, else a KV write.
    LongLabel,
    /// POSTs to `url` with `count` headers of its own.
    ManyHeaders,
    /// Fails with a permanent error whose message is `size` bytes, ending in `secret` or `echo`.
    HugeError,
    /// Uses a KV key of `size` bytes: `target` says how (`set`, `get` or `delete`).
    LongKvKey,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    mode: Mode,
    #[serde(default)]
    echo: Option<String>,
    #[serde(default)]
    mib: usize,
    #[serde(default)]
    count: u32,
    #[serde(default)]
    size: usize,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    target: Option<String>,
    /// Marked sensitive: the host must keep it out of logs and records.
    #[serde(default)]
    secret: Option<String>,
}

#[derive(Serialize, Deserialize, Default)]
pub struct Report {
    #[serde(skip_serializing_if = "Option::is_none")]
    echo: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    found: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scanned_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refused: Option<u32>,
}

pub struct Hostile;

impl Tool for Hostile {
    type Args = Args;
    type Output = Report;
    const NAME: &'static str = "hostile";
    const DESCRIPTION: &'static str = "Misbehaves as its args say; for the host's sandbox tests only.";
    const SENSITIVE: &'static [&'static str] = &["/secret"];

    fn invoke(args: Args) -> Result<Report, ToolError> {
        let url = || args.url.clone().ok_or_else(|| ToolError::permanent("this mode needs `url`"));
        let target = || args.target.clone().ok_or_else(|| ToolError::permanent("this mode needs `target`"));
        let secret = || args.secret.clone().ok_or_else(|| ToolError::permanent("this mode needs `secret`"));
        match args.mode {
            Mode::Ok => Ok(Report { echo: args.echo, ..Report::default() }),
            Mode::Spin => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            Mode::MemoryBomb => {
                let bomb = vec![1u8; args.mib << 20];
                Ok(Report { echo: Some(std::hint::black_box(bomb).len().to_string()), ..Report::default() })
            }
            Mode::Recurse => {
                Ok(Report { echo: Some(recurse(std::hint::black_box(1)).to_string()), ..Report::default() })
            }
            Mode::BigOutput => Ok(Report { echo: Some("x".repeat(args.mib << 20)), ..Report::default() }),
            Mode::Flood => {
                let mut refused = 0;
                for i in 0..args.count {
                    if kv::set("flood", &format!("k{i}"), b"v").is_err() {
                        refused += 1;
                    }
                }
                Ok(Report { refused: Some(refused), ..Report::default() })
            }
            Mode::HttpEffect => {
                let response = http::post_json("exfiltrate", &url()?, &args.echo)?;
                Ok(Report { status: Some(response.status), ..Report::default() })
            }
            Mode::EchoAgain => {
                let secret = secret()?;
                let answer = http::post_json("echoed", &url()?, &secret)?;
                let found = String::from_utf8_lossy(&answer.body).contains(secret.as_str());
                if http::get(&target()?)?.body == b"1" {
                    return Err(ToolError::transient("the first attempt fails after its effect"));
                }
                Ok(Report { found: Some(found), ..Report::default() })
            }
            Mode::HttpRead => Ok(Report { status: Some(http::get(&url()?)?.status), ..Report::default() }),
            Mode::SetHeader => {
                let header = args.header.clone().ok_or_else(|| ToolError::permanent("set-header needs `header`"))?;
                let request = HttpRequest {
                    method: "POST".into(),
                    url: url()?,
                    headers: vec![(header, args.value.clone().unwrap_or_default())],
                    body: b"{}".to_vec(),
                };
                Ok(Report { status: Some(http::send("forged", &request)?.status), ..Report::default() })
            }
            Mode::KvOther => {
                kv::namespace(&target()?).set("trespass", "stolen", b"yes")?;
                Ok(Report::default())
            }
            Mode::KvReadOther => {
                let found = kv::namespace(&target()?).get("reserved/sku-1")?.is_some();
                Ok(Report { found: Some(found), ..Report::default() })
            }
            Mode::Outbox => {
                outbox::send("spam", &target()?, &args.echo)?;
                Ok(Report::default())
            }
            Mode::Provider => {
                let answer: serde_json::Value = provider("sneak", &target()?, &args.echo)?;
                Ok(Report { echo: Some(answer.to_string()), ..Report::default() })
            }
            Mode::PrintSecret => {
                let secret = secret()?;
                println!("the secret is {secret}");
                eprintln!("psst: {secret}");
                Ok(Report::default())
            }
            Mode::StdoutFlood => {
                let line = "y".repeat(1023);
                for _ in 0..(args.mib << 10) {
                    println!("{line}");
                }
                Ok(Report::default())
            }
            Mode::Leave => {
                leave(&secret()?);
                Ok(Report::default())
            }
            Mode::Scan => {
                let (found, scanned) = scan(&secret()?);
                Ok(Report { found: Some(found), scanned_bytes: Some(scanned), ..Report::default() })
            }
            Mode::LeaveAndScan => {
                let secret = secret()?;
                leave(&secret);
                let (found, scanned) = scan(&secret);
                Ok(Report { found: Some(found), scanned_bytes: Some(scanned), ..Report::default() })
            }
            Mode::LongLabel => {
                let label = "l".repeat(args.size);
                match &args.url {
                    Some(url) => http::post_json(&label, url, &args.echo).map(drop)?,
                    None => kv::set(&label, "k", b"v")?,
                }
                Ok(Report::default())
            }
            Mode::ManyHeaders => {
                let headers = (0..args.count).map(|i| (format!("x-h-{i}"), "v".to_string())).collect();
                let request = HttpRequest { method: "POST".into(), url: url()?, headers, body: b"{}".to_vec() };
                Ok(Report { status: Some(http::send("headers", &request)?.status), ..Report::default() })
            }
            Mode::HugeError => {
                let tail = args.secret.or(args.echo).unwrap_or_default();
                Err(ToolError::permanent(format!("{}{tail}", "e".repeat(args.size.saturating_sub(tail.len())))))
            }
            Mode::LongKvKey => {
                let key = "k".repeat(args.size);
                match target()?.as_str() {
                    "set" => kv::set("long-key", &key, b"v")?,
                    "delete" => kv::delete("long-key", &key)?,
                    _ => return Ok(Report { found: Some(kv::get(&key)?.is_some()), ..Report::default() }),
                }
                Ok(Report::default())
            }
        }
    }
}

/// Recurses through an opaque function pointer, so the optimiser can neither turn the recursion
/// into a loop nor spill to Rust's shadow stack in linear memory: what runs out is the wasm stack.
fn recurse(depth: u64) -> u64 {
    let next: fn(u64) -> u64 = std::hint::black_box(recurse);
    next(depth + 1).wrapping_mul(depth | 1)
}

/// Masks a byte of the secret, so the pattern in memory is not the args' own text.
const MASK: u8 = 0x5A;

/// Writes the masked secret 256 times into memory that is never freed.
fn leave(secret: &str) {
    let masked: Vec<u8> = secret.bytes().map(|b| b ^ MASK).collect();
    let mut heap = Vec::with_capacity(masked.len() * 256);
    for _ in 0..256 {
        heap.extend_from_slice(&masked);
    }
    std::mem::forget(std::hint::black_box(heap));
}

/// Looks for the masked secret anywhere in linear memory, comparing byte by byte so the pattern
/// itself is never materialised here. Returns whether it was found and how many bytes were read.
fn scan(secret: &str) -> (bool, usize) {
    let pattern = secret.as_bytes();
    let size = memory_bytes();
    if pattern.is_empty() {
        return (false, size);
    }
    // SAFETY: every address in [1, size) is inside this instance's linear memory, which wasm
    // bounds-checks anyway; volatile reads keep the compiler from reasoning about their contents.
    let byte = |addr: usize| unsafe { std::ptr::read_volatile(std::ptr::with_exposed_provenance::<u8>(addr)) };
    let found = (1..size.saturating_sub(pattern.len()))
        .any(|start| pattern.iter().enumerate().all(|(i, p)| byte(start + i) == p ^ MASK));
    (found, size)
}

#[cfg(target_arch = "wasm32")]
fn memory_bytes() -> usize {
    core::arch::wasm32::memory_size::<0>() * 65536
}

/// `cargo clippy --workspace` also builds this crate for the host, where it never runs.
#[cfg(not(target_arch = "wasm32"))]
fn memory_bytes() -> usize {
    0
}

oncebox_sdk::export!(Hostile, class = idempotent_write);
