//! Behaves as told: returns, traps, or fails with a given class. Before that it can write one KV
//! effect, POST one HTTP effect, or call an embedder's effect provider, so tests can see what a
//! failure (or a kill) after an effect leaves behind.

use oncebox_sdk::{Tool, ToolError, http, kv, provider};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Ok,
    Trap,
    Transient,
    Permanent,
    Unknown,
    RateLimited,
    /// Asks for far more memory than an attempt may have.
    MemoryBomb,
    /// Never returns.
    Spin,
    /// Sleeps `sleep_ms`, then returns: a slow worker, which yields to the host while it waits.
    Sleep,
    /// Busy-waits `sleep_ms` without ever yielding, then returns: a worker whose thread is stuck,
    /// so its host cannot even renew its lease.
    Busy,
    /// Not deterministic: the first time (no `panicky/flipped` in KV) it writes that key and calls
    /// the provider; every later time it skips the provider and succeeds.
    Flip,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    mode: Mode,
    #[serde(default)]
    write_first: bool,
    #[serde(default)]
    echo: Option<String>,
    #[serde(default)]
    sleep_ms: u64,
    /// Calls this embedder provider with `echo` first.
    #[serde(default)]
    provider: Option<String>,
    /// POSTs this body to this URL first (an HTTP effect labelled `post`), and fails unless the
    /// answer is a 2xx.
    #[serde(default)]
    post: Option<Post>,
    /// Then GETs this URL (a read: nothing of it is recorded), so a test can see from outside
    /// that the tool got past the POST's answer.
    #[serde(default)]
    then_get: Option<String>,
    /// Then POSTs this body to this URL (an HTTP effect labelled `then-post`), and fails unless
    /// the answer is a 2xx.
    #[serde(default)]
    then_post: Option<Post>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Post {
    url: String,
    body: serde_json::Value,
}

#[derive(Serialize, Deserialize)]
pub struct Echo {
    echo: Option<String>,
    provided: Option<serde_json::Value>,
}

/// POSTs `post` as the HTTP effect `label`; fails unless the answer is a 2xx.
fn send(label: &str, post: &Post) -> Result<(), ToolError> {
    let response = http::post_json(label, &post.url, &post.body)?;
    if !(200..300).contains(&response.status) {
        return Err(ToolError::permanent(format!("the POST `{label}` was answered {}", response.status)));
    }
    Ok(())
}

pub struct Panicky;

impl Tool for Panicky {
    type Args = Args;
    type Output = Echo;
    const NAME: &'static str = "panicky";
    const DESCRIPTION: &'static str = "Returns, traps or fails as its args say.";

    fn invoke(args: Args) -> Result<Echo, ToolError> {
        if args.write_first {
            kv::set("before-failing", "panicky/last", b"written")?;
        }
        if let Some(post) = &args.post {
            send("post", post)?;
        }
        if let Some(url) = &args.then_get {
            http::get(url)?;
        }
        if let Some(post) = &args.then_post {
            send("then-post", post)?;
        }
        if let Mode::Flip = args.mode {
            if kv::get("panicky/flipped")?.is_none() {
                kv::set("flip", "panicky/flipped", b"yes")?;
                let name = args.provider.as_deref().unwrap_or("bank");
                let provided: serde_json::Value = provider("provided", name, &args.echo)?;
                return Ok(Echo { echo: args.echo, provided: Some(provided) });
            }
            return Ok(Echo { echo: Some("skipped the provider".into()), provided: None });
        }
        let provided = match &args.provider {
            Some(name) => Some(provider("provided", name, &args.echo)?),
            None => None,
        };
        match args.mode {
            Mode::Ok => Ok(Echo { echo: args.echo, provided }),
            Mode::Trap => panic!("asked to trap"),
            Mode::Transient => Err(ToolError::transient("asked to fail transiently")),
            Mode::Permanent => Err(ToolError::permanent("asked to fail permanently")),
            Mode::Unknown => Err(ToolError::unknown_outcome("asked to report an unknown outcome")),
            Mode::RateLimited => Err(ToolError::rate_limited(10, "asked to be rate limited")),
            Mode::MemoryBomb => {
                let bomb = vec![1u8; 1 << 30];
                Ok(Echo { echo: Some(bomb.len().to_string()), provided })
            }
            Mode::Flip => Err(ToolError::permanent("unreachable: flip returns above")),
            Mode::Sleep => {
                std::thread::sleep(std::time::Duration::from_millis(args.sleep_ms));
                Ok(Echo { echo: args.echo, provided })
            }
            Mode::Busy => {
                let until = std::time::Instant::now() + std::time::Duration::from_millis(args.sleep_ms);
                while std::time::Instant::now() < until {
                    std::hint::black_box(0u64);
                }
                Ok(Echo { echo: args.echo, provided })
            }
            Mode::Spin => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
        }
    }
}

oncebox_sdk::export!(Panicky, class = idempotent_write);
