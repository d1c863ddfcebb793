//! How a PostgreSQL ledger is named in messages: its connection string without any password.

/// `url` without its password, in either form libpq accepts: a URI
/// (`postgres://user:secret@host/db?password=secret`) or key/value pairs
/// (`host=h password='a secret' dbname=d`). Rebuilt from what the driver itself parses (user,
/// hosts, ports, database) rather than cut out of the text, so that no spelling the driver
/// reads as a password (an `@` or `?` inside one, a percent-encoded key) survives into a
/// message; options are left out. A string the driver cannot parse is not shown at all.
pub fn without_password(url: &str) -> String {
    let Ok(config) = url.parse::<tokio_postgres::Config>() else {
        return "a PostgreSQL connection string that does not parse (not shown: it may hold a password)".into();
    };
    let user = config.get_user().map(|user| format!("{user}@")).unwrap_or_default();
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let host = match host {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            match ports.get(i).or(ports.first()) {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        })
        .collect();
    let database = config.get_dbname().unwrap_or_default();
    format!("postgres://{user}{}/{database}", hosts.join(","))
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn a_password_never_reaches_a_message() {
        let cases = [
            ("postgres://alice:s3cret@db.example:5432/ledger", "postgres://alice@db.example:5432/ledger"),
            ("postgresql://alice@db/ledger?sslmode=disable", "postgres://alice@db:5432/ledger"),
            ("postgres://db/ledger?password=s3cret&user=bob", "postgres://bob@db:5432/ledger"),
            ("postgres://a:p%40ss@db/l", "postgres://a@db:5432/l"),
            ("host=db password=s3cret dbname=ledger", "postgres://db/ledger"),
            ("host=db password = 'a \\' secret' user=x", "postgres://x@db/"),
        ];
        for (url, named) in cases {
            assert_eq!(without_password(url), named, "{url}");
        }
        // Spellings a text-cutting redaction missed, which the driver reads as passwords.
        for url in
            ["postgres://alice:pa?ss3cret@db/ledger", "postgres://db/ledger?pass%77ord=s3cret", "not a url s3cret"]
        {
            assert!(!without_password(url).contains("s3cret"), "{url}: {}", without_password(url));
        }
    }
}
