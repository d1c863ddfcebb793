//! The console's sign-ins: sessions that are random, expire and end at sign-out, and a bound on
//! wrong tokens. Held in memory: a restart signs every operator out, which costs a sign-in and
//! keeps a stolen cookie from outliving the process that issued it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a console session lasts after its sign-in; the cookie's `Max-Age` says the same.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// The most sessions alive at once; a sign-in beyond it ends the oldest. Only the token's holder
/// signs in, so this bounds memory, not who may enter.
pub const MAX_SESSIONS: usize = 64;
/// Wrong tokens the sign-in form takes within [`SIGN_IN_WINDOW`], from anyone; beyond them it
/// takes no token (a right one neither) until the window has moved on. The API's bearer token is
/// not limited: a wrong one there is refused without a session to gain.
pub const MAX_WRONG_SIGN_INS: usize = 10;
pub const SIGN_IN_WINDOW: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct Sessions {
    /// Session id (hex) -> when it ends.
    live: Mutex<HashMap<String, Instant>>,
    /// When each recent wrong token was given, oldest first.
    wrong: Mutex<Vec<Instant>>,
}

impl Sessions {
    /// A new session: a random id, alive for [`SESSION_TTL`].
    pub fn open(&self) -> Result<String, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        let id = hex::encode(bytes);
        let now = Instant::now();
        let mut live = lock(&self.live);
        live.retain(|_, ends| *ends > now);
        while live.len() >= MAX_SESSIONS {
            let Some(oldest) = live.iter().min_by_key(|(_, ends)| **ends).map(|(id, _)| id.clone()) else { break };
            live.remove(&oldest);
        }
        live.insert(id.clone(), now + SESSION_TTL);
        Ok(id)
    }

    /// Whether `id` is a session that is open and not expired.
    pub fn is_open(&self, id: &str) -> bool {
        let now = Instant::now();
        let mut live = lock(&self.live);
        match live.get(id) {
            Some(ends) if *ends > now => true,
            Some(_) => {
                live.remove(id);
                false
            }
            None => false,
        }
    }

    /// Ends a session (sign-out): its cookie opens nothing from now on.
    pub fn close(&self, id: &str) {
        lock(&self.live).remove(id);
    }

    /// Whether the sign-in form may take a token now; `Err` says for how long it may not.
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

    /// Counts a wrong token given to the sign-in form.
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
    fn a_session_is_random_and_ends_at_sign_out() {
        let sessions = Sessions::default();
        let (a, b) = (sessions.open().expect("random"), sessions.open().expect("random"));
        assert_ne!(a, b);
        assert!(sessions.is_open(&a) && sessions.is_open(&b));
        sessions.close(&a);
        assert!(!sessions.is_open(&a) && sessions.is_open(&b));
        assert!(!sessions.is_open("forged"));
    }

    #[test]
    fn sessions_are_bounded_the_oldest_ending_first() {
        let sessions = Sessions::default();
        let first = sessions.open().expect("random");
        for _ in 0..MAX_SESSIONS {
            sessions.open().expect("random");
        }
        assert!(!sessions.is_open(&first));
        assert_eq!(lock(&sessions.live).len(), MAX_SESSIONS);
    }

    #[test]
    fn wrong_tokens_close_the_form_for_the_rest_of_the_window() {
        let sessions = Sessions::default();
        for _ in 0..MAX_WRONG_SIGN_INS {
            assert!(sessions.may_try().is_ok());
            sessions.wrong_token();
        }
        let wait = sessions.may_try().expect_err("closed");
        assert!(wait <= SIGN_IN_WINDOW && wait > SIGN_IN_WINDOW - Duration::from_secs(5), "{wait:?}");
    }
}
