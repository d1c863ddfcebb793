//! `oncebox-example-provider [PORT]`: runs the example provider on
//! `127.0.0.1:PORT` (default 0, a free port) until the process is killed.
//!
//! The first line on stdout is the base URL, e.g. `http://127.0.0.1:41234`, so a
//! parent process that asked for port 0 can learn the port.

use std::io::Write;
use std::process::ExitCode;

use oncebox_example_provider::Provider;

const USAGE: &str = "usage: oncebox-example-provider [PORT]";

#[tokio::main]
async fn main() -> ExitCode {
    let port = match parse_port(std::env::args().skip(1).collect()) {
        Ok(port) => port,
        Err(message) => {
            eprintln!("{message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let provider = match Provider::start_on(port).await {
        Ok(provider) => provider,
        Err(err) => {
            eprintln!("oncebox-example-provider: cannot listen on 127.0.0.1:{port}: {err}");
            return ExitCode::FAILURE;
        }
    };
    // Flush explicitly: stdout is usually a pipe to the parent, which waits for this line.
    let mut stdout = std::io::stdout().lock();
    if let Err(err) = writeln!(stdout, "{}", provider.base_url()).and_then(|()| stdout.flush()) {
        eprintln!("oncebox-example-provider: cannot write the address: {err}");
        return ExitCode::FAILURE;
    }
    drop(stdout);
    // Serve until killed; the handle must stay alive, as dropping it stops the server.
    std::future::pending::<()>().await;
    drop(provider);
    ExitCode::SUCCESS
}

fn parse_port(args: Vec<String>) -> Result<u16, String> {
    match args.as_slice() {
        [] => Ok(0),
        [flag] if flag == "-h" || flag == "--help" => Err(String::new()),
        [port] => port.parse().map_err(|_| format!("invalid port {port:?}: expected 0 to 65535")),
        _ => Err("too many arguments".to_owned()),
    }
}
