//! Listings by the page: a `limit` and an opaque cursor (`after`), in key order. A listing reads
//! the page it was asked for, never the whole history (DESIGN section 9): the ledger's reads
//! behind each (`Ledger::runs_page`, the index of open work) grow with the page, or with what is
//! open, not with what was ever recorded.

use serde::Deserialize;

/// The page size when none is asked for.
pub const DEFAULT_LIMIT: usize = 50;
/// The largest page a request may ask for: bounds what one request reads and renders.
pub const MAX_LIMIT: usize = 500;

/// `?limit=N&after=CURSOR`: the cursor is the `next` of the previous page (a key: opaque to the
/// caller, who passes it back as given).
#[derive(Debug, Default, Deserialize)]
pub struct PageQuery {
    pub limit: Option<usize>,
    pub after: Option<String>,
}

impl PageQuery {
    /// The page size asked for, bounded by [`MAX_LIMIT`] (at least 1).
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT)
    }

    /// The page size asked for, refused (with why) outside 1 to [`MAX_LIMIT`]: the API says so
    /// rather than answer another page than the one asked for.
    pub fn checked_limit(&self) -> Result<usize, String> {
        match self.limit {
            Some(limit) if !(1..=MAX_LIMIT).contains(&limit) => {
                Err(format!("`limit` must be 1 to {MAX_LIMIT}, got {limit}"))
            }
            _ => Ok(self.limit()),
        }
    }

    pub fn after(&self) -> Option<&str> {
        self.after.as_deref().filter(|after| !after.is_empty())
    }

    /// The page of `keyed` (sorted by key, unique) that this query asks for, and the cursor of the
    /// next page if there is one.
    pub fn of<T>(&self, keyed: Vec<T>, key: impl Fn(&T) -> &str) -> (Vec<T>, Option<String>) {
        let mut page: Vec<T> =
            keyed.into_iter().filter(|item| self.after().is_none_or(|after| key(item) > after)).collect();
        let next = (page.len() > self.limit()).then(|| key(&page[self.limit() - 1]).to_string());
        page.truncate(self.limit());
        (page, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_starts_after_its_cursor_and_names_the_next_one_only_if_there_is_more() {
        let keys = || vec!["a", "b", "c", "d", "e"];
        let query = PageQuery { limit: Some(2), after: None };
        assert_eq!(query.of(keys(), |k| k), (vec!["a", "b"], Some("b".to_string())));
        let query = PageQuery { limit: Some(2), after: Some("b".into()) };
        assert_eq!(query.of(keys(), |k| k), (vec!["c", "d"], Some("d".to_string())));
        let query = PageQuery { limit: Some(2), after: Some("d".into()) };
        assert_eq!(query.of(keys(), |k| k), (vec!["e"], None));
        assert_eq!(PageQuery { limit: Some(0), after: None }.limit(), 1);
        assert_eq!(PageQuery { limit: Some(1 << 40), after: None }.limit(), MAX_LIMIT);
    }
}
