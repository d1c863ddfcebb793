//! A group's writes in one statement: each kind of row's statement (`writes.rs`, `index.rs`)
//! becomes a part, a data-modifying `WITH` clause of one statement, so that the group's second
//! round is that statement and COMMIT. Every statement the server answers costs it an answer sent
//! and flushed on its own (tokio-postgres ends each with a Sync), which was a fifth of the
//! group runner's backend time with a statement per kind (BENCHMARKS.md).
//!
//! The parts of one statement run on one snapshot and do not see each other's rows: a part that
//! writes a row another part of the same statement also writes would change it once, and which
//! write is kept is not defined (PostgreSQL's docs, "Data-Modifying Statements in WITH"). An
//! unchecked upsert would lose the other write silently. No group's writes name a row twice (each
//! kind keeps the last write per row, and jobs that write one operation's rows never share a
//! group), so a repeat is a bug: [`statements`] refuses it, and nothing of the group is written,
//! rather than guess which write was meant. Parts too large together go as a statement each, in
//! the order given (parents before the rows that refer to them); their rows are distinct, so that
//! order changes nothing else.
//!
//! A part's foreign keys (an effect's or an attempt's operation) are checked at the end of the
//! whole statement, so a part may refer to a row an earlier part of it inserts.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::Write as _;

use super::pipeline::{Param, Sql};

/// What the statement checks of a part.
pub(super) enum Check {
    /// Nothing: it writes whatever it finds (an upsert, a removal).
    None,
    /// It changes exactly this many rows (its body `RETURNING 1` per row), or the statement fails
    /// with a division by zero (`grouped::GUARD_FAILED`) and the transaction with it.
    Exactly(i64),
    /// Its body is a `SELECT` run for its effect (a notification): the statement reads it whole so
    /// that it runs.
    Evaluated,
}

/// One kind of row's write.
pub(super) struct Part {
    /// The statement, without `WITH`; its parameters are its own, `$1` on.
    pub body: Cow<'static, str>,
    pub params: Vec<Param>,
    pub check: Check,
    /// The rows it writes, each by [`row`] of its table and key.
    pub rows: Vec<RowName>,
    /// Roughly how many bytes its parameters carry.
    pub bytes: usize,
}

impl Part {
    /// `statement` as a part: its body and parameters, with its check, the rows it writes and
    /// the bytes they carry.
    pub fn of(statement: Sql, check: Check, rows: Vec<RowName>, bytes: usize) -> Part {
        Part { body: statement.text, params: statement.params, check, rows, bytes }
    }
}

/// A row: its table and its key's columns, each prefixed by its length so that no two keys read
/// alike.
pub(super) type RowName = (&'static str, String);

/// The name of the row of `table` whose key's columns are `key`, for [`Part::rows`].
pub(super) fn row(table: &'static str, key: &[&str]) -> RowName {
    let mut name = String::new();
    for column in key {
        let _ = write!(name, "{}:{column}", column.len());
    }
    (table, name)
}

/// A group's writes named one row twice: a bug of the code that gathered them.
#[derive(Debug)]
pub(super) struct RowTwice(RowName);

impl std::fmt::Display for RowTwice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a group's writes named one row of {} twice ({}), which one statement would write once: nothing was \
             written",
            self.0.0, self.0.1
        )
    }
}

/// The most bytes of rows one statement carries: a message to the server may not exceed 1 GB,
/// and a guest may stage up to a thousand effects of a MiB each, so large rows go in several
/// parts (`writes.rs`), and parts larger than this together in a statement each.
pub(super) const STATEMENT_BYTES: usize = 16 << 20;

/// `parts` as one statement, or as a statement each (in order) when they are too large together;
/// none for no parts. Refused if they name a row twice.
pub(super) fn statements(parts: Vec<Part>) -> Result<Vec<Sql>, RowTwice> {
    let mut seen = HashSet::with_capacity(parts.iter().map(|part| part.rows.len()).sum());
    if let Some(twice) = parts.iter().flat_map(|part| &part.rows).find(|row| !seen.insert(*row)) {
        return Err(RowTwice(twice.clone()));
    }
    if parts.is_empty() {
        return Ok(Vec::new());
    }
    if parts.iter().map(|part| part.bytes).sum::<usize>() <= STATEMENT_BYTES {
        return Ok(vec![joined(parts)]);
    }
    Ok(parts.into_iter().map(|part| joined(vec![part])).collect())
}

/// `WITH w0 AS (...), w1 AS (...) SELECT` the checks, each part's parameters numbered after the
/// parts' before it, the checks' counts last.
fn joined(parts: Vec<Part>) -> Sql {
    let mut text = String::from("WITH ");
    let mut params: Vec<Param> = Vec::new();
    let mut checks = Vec::new();
    for (i, part) in parts.into_iter().enumerate() {
        if i > 0 {
            text.push_str(", ");
        }
        let materialized = if matches!(part.check, Check::Evaluated) { "MATERIALIZED " } else { "" };
        let _ = write!(text, "w{i} AS {materialized}(");
        renumber(&part.body, params.len(), &mut text);
        text.push(')');
        params.extend(part.params);
        checks.push((i, part.check));
    }
    let mut columns = Vec::new();
    for (i, check) in checks {
        match check {
            Check::None => {}
            Check::Exactly(n) => {
                params.push(Box::new(n));
                columns.push(format!("1 / ((SELECT count(*) FROM w{i}) = ${})::int", params.len()));
            }
            Check::Evaluated => columns.push(format!("(SELECT count(*) FROM w{i})")),
        }
    }
    text.push_str(" SELECT ");
    if columns.is_empty() {
        text.push('1');
    } else {
        text.push_str(&columns.join(", "));
    }
    Sql { text: text.into(), params }
}

/// Appends `body` to `out` with each parameter `$n` as `$(n + offset)`. The bodies are this
/// crate's constants: no `$` in them but their parameters'.
fn renumber(body: &str, offset: usize, out: &mut String) {
    let mut rest = body;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        match rest[at + 1..at + 1 + digits].parse::<usize>() {
            Ok(n) => {
                let _ = write!(out, "${}", n + offset);
            }
            Err(_) => out.push('$'),
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
}

/// The heads of a joined statement's parts (`INSERT INTO oncebox_kv`), for a message naming them.
pub(super) fn heads(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0.. {
        let Some(at) = text.find(&format!("w{i} AS ")) else { break };
        let part = &text[at..];
        let body = part.split_once('(').map_or(part, |(_, body)| body);
        out.push(body.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(body: &'static str, params: usize, check: Check, rows: &[RowName]) -> Part {
        Part {
            body: body.into(),
            params: (0..params).map(|i| Box::new(i as i64) as Param).collect(),
            check,
            rows: rows.to_vec(),
            bytes: 0,
        }
    }

    fn texts(statements: &[Sql]) -> Vec<&str> {
        statements.iter().map(|s| s.text.as_ref()).collect()
    }

    #[test]
    fn parts_are_numbered_after_each_other_and_their_checks_come_last() {
        let sql = statements(vec![
            part(
                "INSERT INTO a SELECT * FROM unnest($1::text[], $2::bigint[]) RETURNING 1",
                2,
                Check::Exactly(2),
                &[row("a", &["1"])],
            ),
            part("DELETE FROM b WHERE k = ANY($1::text[])", 1, Check::None, &[row("b", &["1"])]),
            part("SELECT pg_notify($1, k) FROM unnest($2::text[]) AS k", 2, Check::Evaluated, &[]),
        ])
        .expect("rows named once");
        assert_eq!(
            texts(&sql),
            ["WITH w0 AS (INSERT INTO a SELECT * FROM unnest($1::text[], $2::bigint[]) RETURNING 1), \
              w1 AS (DELETE FROM b WHERE k = ANY($3::text[])), \
              w2 AS MATERIALIZED (SELECT pg_notify($4, k) FROM unnest($5::text[]) AS k) \
              SELECT 1 / ((SELECT count(*) FROM w0) = $6)::int, (SELECT count(*) FROM w2)"]
        );
        assert_eq!(sql[0].params.len(), 6);
    }

    #[test]
    fn a_row_named_twice_is_refused_whatever_the_parts() {
        let a = row("oncebox_kv", &["ns", "k"]);
        let refused = statements(vec![
            part("UPDATE x SET v = 1 WHERE k = $1 RETURNING 1", 1, Check::Exactly(1), std::slice::from_ref(&a)),
            part("INSERT INTO y VALUES ($1)", 1, Check::None, &[row("oncebox_kv", &["ns", "other"])]),
            part(
                "INSERT INTO x VALUES ($1) ON CONFLICT (k) DO UPDATE SET v = 2",
                1,
                Check::None,
                std::slice::from_ref(&a),
            ),
        ]);
        let Err(twice) = refused else { panic!("joined a row written twice") };
        assert!(
            twice.to_string().contains("oncebox_kv") && twice.to_string().contains("nothing was written"),
            "{twice}"
        );
        // Within one part too.
        assert!(statements(vec![part("DELETE FROM x", 0, Check::None, &[a.clone(), a])]).is_err());
    }

    #[test]
    fn rows_are_told_apart_by_table_and_every_column_of_their_key() {
        assert_ne!(row("oncebox_kv", &["ns", "k"]), row("oncebox_kv", &["ns", "k2"]));
        assert_ne!(row("oncebox_kv", &["ab", "c"]), row("oncebox_kv", &["a", "bc"]));
        assert_ne!(row("oncebox_kv", &["k"]), row("oncebox_open", &["k"]));
        assert_eq!(row("oncebox_open", &["k"]), row("oncebox_open", &["k"]));
    }

    #[test]
    fn too_many_bytes_together_go_apart_in_order() {
        let mut big = part("DELETE FROM b WHERE k = ANY($1::text[])", 1, Check::None, &[row("b", &["1"])]);
        big.bytes = STATEMENT_BYTES;
        let mut small = part("DELETE FROM c WHERE k = ANY($1::text[])", 1, Check::None, &[row("c", &["1"])]);
        small.bytes = 1;
        let sql = statements(vec![big, small]).expect("rows named once");
        assert_eq!(
            texts(&sql),
            [
                "WITH w0 AS (DELETE FROM b WHERE k = ANY($1::text[])) SELECT 1",
                "WITH w0 AS (DELETE FROM c WHERE k = ANY($1::text[])) SELECT 1"
            ]
        );
    }

    #[test]
    fn the_heads_name_every_part() {
        let sql = statements(vec![
            part("INSERT INTO oncebox_kv (a) SELECT 1", 0, Check::None, &[row("a", &["1"])]),
            part("UPDATE oncebox_effects e SET a = 1", 0, Check::None, &[row("b", &["1"])]),
        ])
        .expect("rows named once");
        assert_eq!(heads(&sql[0].text), ["INSERT INTO oncebox_kv", "UPDATE oncebox_effects e"]);
    }

    /// Why a row named twice is refused, on a real server: two upserts of one row in one
    /// statement do not leave the later write (PostgreSQL refuses the statement, or keeps one).
    #[tokio::test]
    async fn one_statement_does_not_keep_the_later_of_two_writes_of_a_row() {
        let url = oncebox_pg_cluster::fresh_database().await;
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(connection);
        client.batch_execute("CREATE TABLE t (k text PRIMARY KEY, v bigint)").await.expect("table");
        let upsert = |v: &'static str| Part {
            body: v.into(),
            params: vec![Box::new("x") as Param],
            check: Check::None,
            rows: vec![row("t", &["x"])],
            bytes: 0,
        };
        let parts = || {
            vec![
                upsert("INSERT INTO t VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET v = 1"),
                upsert("INSERT INTO t VALUES ($1, 2) ON CONFLICT (k) DO UPDATE SET v = 2"),
            ]
        };
        assert!(statements(parts()).is_err(), "refused");
        let statement = joined(parts());
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            statement.params.iter().map(|p| p.as_ref() as _).collect();
        let joined = client.execute(statement.text.as_ref(), &params).await;
        let value = client.query_opt("SELECT v FROM t WHERE k = 'x'", &[]).await.expect("read");
        assert!(joined.is_err() || value.map(|r| r.get::<_, i64>(0)) != Some(2), "the later write kept");
    }
}
