//! The console's sign-in: a bound on wrong tokens. The sign-in itself is the browser's Basic
//! credentials (`auth`), which hold the token; nothing of it is kept here, so a restart signs
//! nobody out and a token rotated (a new `--token-file`, a restart) signs everyone out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Wrong tokens the sign-in page takes within [`SIGN_IN_WINDOW`], from anyone; beyond them it
/// takes no token (a right one neither) until the window has moved on. The bearer token (and the
/// Basic credentials a signed-in browser sends with every page) is not limited: a wrong one is
/// refused, with nothing to gain but the refusal, and tokens are random (at least 16 characters).
pub const MAX_WRONG_SIGN_INS: usize = 10;
pub const SIGN_IN_WINDOW: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct WrongTokens {
    /// When each recent wrong token was given, oldest first.
    wrong: Mutex<Vec<Instant>>,
}

impl WrongTokens {
    /// Whether the sign-in page may take a token now; `Err` says for how long it may not.
    pub fn may_try(&self) -> Result<(), Duration> {
        let now = Instant::now();
        let mut wrong = lock(&self.wrong);
        wrong.retain(|at| now.duration_since(*at) < SIGN_IN_WINDOW);
        match wrong.first() {
            Some(oldest) if wrong.len() >= MAX_WRONG_SIGN_INS => {
                Err(SIGN_IN_WINDOW.saturating_sub(now.duration_since(*oldest)))
            }
            _ => Ok(()),
        }
    }

    /// Counts a wrong token given to the sign-in page.
    pub fn wrong_token(&self) {
        lock(&self.wrong).push(Instant::now());
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_tokens_close_the_sign_in_for_the_rest_of_the_window() {
        let wrong = WrongTokens::default();
        for _ in 0..MAX_WRONG_SIGN_INS {
            assert!(wrong.may_try().is_ok());
            wrong.wrong_token();
        }
        let wait = wrong.may_try().expect_err("closed");
        assert!(wait <= SIGN_IN_WINDOW && wait > SIGN_IN_WINDOW - Duration::from_secs(5), "{wait:?}");
    }
}
