//! A second build of `charge` that names another compensation: the example components with the
//! name `refund` changed in place to `refun2` (a name of the same length keeps every offset, so the
//! components stay valid). `refun2` posts to the same `/refunds` (its path is kept) under its own
//! name and effect label. The operator deploys one build of `charge` or the other, between and
//! during compensations: a compensation begun or done by one refund tool must never be run again
//! by the other.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The other refund tool's name.
pub const REFUN2: &str = "refun2";

/// Where `charge` is deployed from, and its two builds.
#[derive(Debug, Clone)]
pub struct Builds {
    /// The file every host loads `charge` from: one build or the other, as deployed.
    pub charge: PathBuf,
    /// `charge` as the example builds it (naming `refund`), and the second build (naming `refun2`).
    v1: PathBuf,
    v2: PathBuf,
    /// `refund`, renamed `refun2` (and its effect's label).
    pub refun2: PathBuf,
}

impl Builds {
    /// Writes the second builds into `dir`, and deploys the first build of `charge` there.
    pub fn write(dir: &Path) -> anyhow::Result<Builds> {
        let builds = Builds {
            charge: dir.join("charge.wasm"),
            v1: PathBuf::from(oncebox_artifacts::CHARGE),
            v2: dir.join("charge-v2.wasm"),
            refun2: dir.join("refun2.wasm"),
        };
        // `charge` says `refund` only where it names its compensation.
        renamed(oncebox_artifacts::CHARGE, &builds.v2, |_, _| false)?;
        // `refund` says it in its name and its effect's label, and in the path it posts to
        // (`/refunds`), which stays.
        renamed(oncebox_artifacts::REFUND, &builds.refun2, |bytes, i| i > 0 && bytes[i - 1] == b'/')?;
        builds.deploy(1)?;
        Ok(builds)
    }

    /// Replaces the file `charge` is loaded from by build `version` (1, the example's; 2, naming
    /// `refun2`), as a deployment does: a host loads it at its start, or when told to reload.
    pub fn deploy(&self, version: u8) -> anyhow::Result<()> {
        let from = if version == 2 { &self.v2 } else { &self.v1 };
        std::fs::copy(from, &self.charge).with_context(|| format!("deploy {}", from.display()))?;
        Ok(())
    }
}

fn renamed(from: &str, to: &Path, keep: impl Fn(&[u8], usize) -> bool) -> anyhow::Result<()> {
    let mut bytes = std::fs::read(from).with_context(|| format!("read {from}"))?;
    let (mut renamed, mut at) = (0, 0);
    while let Some(found) = bytes[at..].windows(6).position(|w| w == b"refund") {
        let i = at + found;
        if !keep(&bytes, i) {
            bytes[i..i + 6].copy_from_slice(REFUN2.as_bytes());
            renamed += 1;
        }
        at = i + 6;
    }
    anyhow::ensure!(renamed > 0, "no name to change in {from}");
    std::fs::write(to, bytes).with_context(|| format!("write {}", to.display()))
}
