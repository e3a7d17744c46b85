//! The `supervisor` binary. It also embeds agentctl and mock-agent as applets
//! (`supervisor agentctl …`, `supervisor mock-agent …`), so the one binary that
//! `cargo run -p supervisor` builds is enough to run sessions.

use std::ffi::OsString;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let exe: Vec<OsString> =
        std::env::current_exe().map(|path| vec![path.into_os_string()]).unwrap_or_default();
    let applet = |name: &str| {
        let mut command = exe.clone();
        command.push(name.into());
        command
    };
    let code = match args.first().map(String::as_str) {
        Some("agentctl") => agentctl::cli::run(&args[1..], applet("agentctl")),
        Some("mock-agent") => agents::mock::main(args[1..].to_vec(), applet("mock-agent")),
        _ => supervisor::cli::main(args, exe),
    };
    std::process::exit(code);
}
