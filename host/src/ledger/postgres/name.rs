//! How a PostgreSQL ledger is named in messages: its connection string without any password.

/// `url` without its password, in either form libpq accepts: a URI
/// (`postgres://user:secret@host/db?password=secret`) or key/value pairs
/// (`host=h password='a secret' dbname=d`).
pub fn without_password(url: &str) -> String {
    let trimmed = url.trim();
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        uri_without_password(trimmed)
    } else {
        pairs_without_password(trimmed)
    }
}

fn uri_without_password(uri: &str) -> String {
    let (scheme, rest) = uri.split_once("://").unwrap_or(("postgres", uri));
    // Userinfo ends at the last '@' before the path or query (a password may hold '@' or '/'
    // only percent-encoded, but be generous: look for the last '@' before any '?').
    let authority_end = rest.find('?').unwrap_or(rest.len());
    let (mut authority_and_path, query) = rest.split_at(authority_end);
    let mut kept = String::new();
    if let Some(at) = authority_and_path[..].rfind('@') {
        let (userinfo, host) = authority_and_path.split_at(at);
        let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
        kept.push_str(user);
        authority_and_path = host;
    }
    kept.push_str(authority_and_path);
    let query: Vec<&str> = query
        .trim_start_matches('?')
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.split('=').next().is_some_and(|k| k.eq_ignore_ascii_case("password")))
        .collect();
    if !query.is_empty() {
        kept.push('?');
        kept.push_str(&query.join("&"));
    }
    format!("{scheme}://{kept}")
}

/// Key/value pairs: `key = value`, a value maybe single-quoted with backslash escapes.
fn pairs_without_password(text: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        if key.is_empty() && chars.peek().is_none() {
            break;
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'=').is_some() {
            while chars.next_if(|c| c.is_whitespace()).is_some() {}
            if chars.next_if_eq(&'\'').is_some() {
                value.push('\'');
                while let Some(c) = chars.next() {
                    value.push(c);
                    match c {
                        '\\' => value.extend(chars.next()),
                        '\'' => break,
                        _ => {}
                    }
                }
            } else {
                while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                    value.push(c);
                }
            }
        } else if key.is_empty() {
            // A stray character that is neither a key nor '=': drop it, and go on.
            chars.next();
            continue;
        }
        if !key.eq_ignore_ascii_case("password") {
            out.push(format!("{key}={value}"));
        }
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn a_password_never_reaches_a_message() {
        let cases = [
            ("postgres://alice:s3cret@db.example:5432/ledger", "postgres://alice@db.example:5432/ledger"),
            ("postgresql://alice@db/ledger?sslmode=disable", "postgresql://alice@db/ledger?sslmode=disable"),
            ("postgres://db/ledger?password=s3cret&user=bob", "postgres://db/ledger?user=bob"),
            ("postgres://a:p%40ss@db/l", "postgres://a@db/l"),
            ("host=db password=s3cret dbname=ledger", "host=db dbname=ledger"),
            ("host=db password = 'a \\' secret' user=x", "host=db user=x"),
        ];
        for (url, named) in cases {
            assert_eq!(without_password(url), named, "{url}");
            assert!(!without_password(url).contains("secret"), "{url}");
        }
    }
}
