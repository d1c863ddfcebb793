//! What one attempt of a tool may consume. Every guest-controlled size is bounded here: the
//! resources of an attempt ([`Limits`]) with a default for every tool, an override per tool in the
//! policy file (`[tools.NAME.limits]`), and a ceiling no override may pass; and the strings a guest
//! hands the host (labels, URLs, headers, keys, names, error messages, the manifest's fields), by
//! fixed constants. Pure: the runtime and the effects enforce these numbers; exceeding a resource
//! limit ends the attempt with a class the retry matrix knows (`failure::End::Limit`), an oversize
//! string is refused (a permanent error to the guest, or the component at load) or, for an error
//! message, cut.
//!
//! The attempt's wall-clock deadline is the retry policy's `attempt_deadline`; the wasm stack is
//! engine-wide ([`WASM_STACK_BYTES`]) because wasmtime sets it per engine, not per store.

/// Linear memory one instance may grow to, by default.
pub const DEFAULT_MEMORY_BYTES: usize = 256 << 20;
/// Elements a table of one instance may grow to, by default.
pub const DEFAULT_TABLE_ELEMENTS: usize = 100_000;
/// The largest args (JSON) a call may carry, by default.
pub const DEFAULT_ARGS_BYTES: usize = 1 << 20;
/// The largest output (JSON) a tool may return, by default.
pub const DEFAULT_OUTPUT_BYTES: usize = 4 << 20;
/// The largest payload one effect may carry (an HTTP body, a KV value, an outbox message, a
/// provider request), by default.
pub const DEFAULT_EFFECT_PAYLOAD_BYTES: usize = 1 << 20;
/// Bytes of stdout, and separately of stderr, one attempt may write, by default.
pub const DEFAULT_STDIO_BYTES: usize = 64 << 10;
/// Effects (of any kind) one attempt may make, by default.
pub const DEFAULT_EFFECTS_PER_ATTEMPT: u32 = 1_000;
/// The wasm stack of every instance. A deeper recursion traps as a stack overflow.
pub const WASM_STACK_BYTES: usize = 512 << 10;

// Fixed bounds on the strings a guest hands the host. They are the same for every tool (a tool
// that needs more is misbehaving, not configured differently), and each is checked before anything
// is recorded, logged or sent, with a refusal naming the limit.

/// An effect's label: it names the effect in its key, its record and the logs. Labels are
/// identifiers chosen by the tool's author (`"charge"`, `"reserve/sku-1"`), never data.
pub const MAX_LABEL_BYTES: usize = 128;
/// A URL of an HTTP effect or read. 8 KiB is what common servers and proxies accept in a request
/// line (nginx, Apache and most CDNs refuse longer ones anyway).
pub const MAX_URL_BYTES: usize = 8 << 10;
/// The HTTP method: the longest registered ones (WebDAV's) have 16 characters.
pub const MAX_METHOD_BYTES: usize = 32;
/// Headers a tool may set on one request. Real APIs need a handful.
pub const MAX_HEADERS: usize = 64;
/// One header name a tool sets.
pub const MAX_HEADER_NAME_BYTES: usize = 256;
/// One header value a tool sets: the usual per-header limit of servers (8 KiB).
pub const MAX_HEADER_VALUE_BYTES: usize = 8 << 10;
/// A KV key, read or written: keys are identifiers (`reserved/sku-1`); values carry the data.
pub const MAX_KV_KEY_BYTES: usize = 1 << 10;
/// A KV namespace, an outbox topic or a provider name. Each must also be granted, so a longer one
/// could only be refused; bounding it first keeps the denial (logged at `warn`) short.
pub const MAX_NAME_BYTES: usize = 256;
/// A guest's error message as the host keeps it (ledger, logs, CLI): longer ones keep their first
/// this-many bytes and a marker saying they were cut. A message is for a person to read.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 4 << 10;

/// The manifest's `name` (and `compensated-by`, which names a tool): `a-z`, `0-9`, `-`, `_`.
pub const MAX_TOOL_NAME_BYTES: usize = 64;
/// The manifest's `version`: a semver string with room for pre-release and build metadata.
pub const MAX_VERSION_BYTES: usize = 64;
/// The manifest's `description`, shown to a model as the tool's documentation.
pub const MAX_DESCRIPTION_BYTES: usize = 4 << 10;
/// The manifest's input schema (JSON text). A generous bound for a derived JSON Schema: the
/// validator compiled from it lives as long as the host.
pub const MAX_INPUT_SCHEMA_BYTES: usize = 256 << 10;
/// Sensitive JSON pointers a manifest may list, and the length of each.
pub const MAX_SENSITIVE_POINTERS: usize = 64;
/// One sensitive JSON pointer.
pub const MAX_SENSITIVE_POINTER_BYTES: usize = 256;

/// `text` if it has at most `max` bytes; else its first `max` bytes (cut back to a char boundary)
/// followed by a marker that says so.
pub fn cut_message(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… (cut at {max} of {} bytes)", &text[..end], text.len())
}

/// How much of the end of a guest's stderr a trap's message carries (a Python traceback's last
/// frames and its exception, a JS exception, a Rust panic's message).
pub const STDERR_TAIL_BYTES: usize = 2 << 10;

/// One tool's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    pub memory_bytes: usize,
    pub table_elements: usize,
    pub args_bytes: usize,
    pub output_bytes: usize,
    pub effect_payload_bytes: usize,
    pub stdio_bytes: usize,
    pub effects_per_attempt: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: DEFAULT_MEMORY_BYTES,
            table_elements: DEFAULT_TABLE_ELEMENTS,
            args_bytes: DEFAULT_ARGS_BYTES,
            output_bytes: DEFAULT_OUTPUT_BYTES,
            effect_payload_bytes: DEFAULT_EFFECT_PAYLOAD_BYTES,
            stdio_bytes: DEFAULT_STDIO_BYTES,
            effects_per_attempt: DEFAULT_EFFECTS_PER_ATTEMPT,
        }
    }
}

/// The most any override may ask for: past these, a limit stops protecting the host.
pub const CEILING: Limits = Limits {
    // wasm32's whole address space; the pooling allocator reserves this much per slot anyway.
    memory_bytes: 4 << 30,
    table_elements: 1_000_000,
    args_bytes: 16 << 20,
    output_bytes: 64 << 20,
    effect_payload_bytes: 16 << 20,
    stdio_bytes: 16 << 20,
    effects_per_attempt: 100_000,
};

/// The names a policy file uses for each limit, and whether the value is a size in bytes.
pub const FIELDS: [(&str, bool); 7] = [
    ("memory", true),
    ("tables", false),
    ("args", true),
    ("output", true),
    ("effect_payload", true),
    ("stdio", true),
    ("effects", false),
];

impl Limits {
    /// Sets the limit a policy file calls `field`, refusing zero and anything over the ceiling.
    pub fn set(&mut self, field: &str, value: u64) -> Result<(), String> {
        let (slot, ceiling) = match field {
            "memory" => (Slot::Bytes(&mut self.memory_bytes), CEILING.memory_bytes as u64),
            "tables" => (Slot::Bytes(&mut self.table_elements), CEILING.table_elements as u64),
            "args" => (Slot::Bytes(&mut self.args_bytes), CEILING.args_bytes as u64),
            "output" => (Slot::Bytes(&mut self.output_bytes), CEILING.output_bytes as u64),
            "effect_payload" => (Slot::Bytes(&mut self.effect_payload_bytes), CEILING.effect_payload_bytes as u64),
            "stdio" => (Slot::Bytes(&mut self.stdio_bytes), CEILING.stdio_bytes as u64),
            "effects" => (Slot::Count(&mut self.effects_per_attempt), u64::from(CEILING.effects_per_attempt)),
            other => {
                let known: Vec<&str> = FIELDS.iter().map(|(name, _)| *name).collect();
                return Err(format!("unknown limit `{other}`; limits are {}", known.join(", ")));
            }
        };
        if value == 0 {
            return Err(format!("limit `{field}` must be more than zero"));
        }
        if value > ceiling {
            return Err(format!("limit `{field}` = {value} is over the ceiling of {ceiling}"));
        }
        // Below the ceiling, so the conversions cannot fail; refusing is still the honest answer.
        let too_large = || format!("limit `{field}` = {value} does not fit this platform");
        match slot {
            Slot::Bytes(s) => *s = usize::try_from(value).map_err(|_| too_large())?,
            Slot::Count(s) => *s = u32::try_from(value).map_err(|_| too_large())?,
        }
        Ok(())
    }
}

enum Slot<'a> {
    Bytes(&'a mut usize),
    Count(&'a mut u32),
}

/// A size such as `65536`, `"64KiB"`, `"256 MiB"` or `"1GiB"` (binary units; `KB`/`MB`/`GB` are
/// read as the same, since nobody sizes memory in powers of ten).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("`{text}` is not a size; write e.g. \"64KiB\" or \"256MiB\""))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => return Err(format!("`{other}` is not a size unit: B, KiB, MiB or GiB")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("`{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("256 MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("64 parsecs").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999GiB").is_err());
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary_with_a_marker() {
        assert_eq!(cut_message("short", 8), "short");
        assert_eq!(cut_message("12345678", 8), "12345678");
        assert_eq!(cut_message("123456789", 8), "12345678… (cut at 8 of 9 bytes)");
        // 'é' is two bytes: a cut inside it backs off to the boundary before it.
        assert_eq!(cut_message("1234567é", 8), "1234567… (cut at 8 of 9 bytes)");
        let huge = "x".repeat(1 << 20);
        let cut = cut_message(&huge, MAX_ERROR_MESSAGE_BYTES);
        assert!(cut.len() < MAX_ERROR_MESSAGE_BYTES + 40 && cut.ends_with("(cut at 4096 of 1048576 bytes)"), "{cut}");
    }

    #[test]
    fn overrides_are_bounded_by_the_ceiling() {
        let mut limits = Limits::default();
        assert_eq!(limits.set("memory", 16 << 20), Ok(()));
        assert_eq!(limits.memory_bytes, 16 << 20);
        assert!(limits.set("memory", 8 << 30).is_err());
        assert!(limits.set("effects", 0).is_err());
        assert!(limits.set("fuel", 1).is_err());
        assert_eq!(limits.memory_bytes, 16 << 20, "a refused override changes nothing");
        for (field, _) in FIELDS {
            assert_eq!(Limits::default().set(field, 1), Ok(()), "{field} is settable");
        }
    }
}
