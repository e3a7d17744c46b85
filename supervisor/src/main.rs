//! The `supervisor` binary. It also embeds agentctl and mock-agent as applets
//! (`supervisor agentctl …`, `supervisor mock-agent …`), so the one binary that
//! `cargo run -p supervisor` builds is enough to run sessions.

use std::ffi::OsString;

fn main() {
    // Arguments as the OS gave them: a path need not be UTF-8, and the CLI says so
    // instead of panicking.
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let exe: Vec<OsString> =
        std::env::current_exe().map(|path| vec![path.into_os_string()]).unwrap_or_default();
    let applet = |name: &str| {
        let mut command = exe.clone();
        command.push(name.into());
        command
    };
    let utf8 = |rest: &[OsString]| -> Option<Vec<String>> {
        rest.iter().map(|arg| arg.clone().into_string().ok()).collect()
    };
    let code = match args.first().and_then(|first| first.to_str()) {
        Some(name @ ("agentctl" | "mock-agent")) => match utf8(&args[1..]) {
            Some(rest) if name == "agentctl" => agentctl::cli::run(&rest, applet("agentctl")),
            Some(rest) => agents::mock::main(rest, applet("mock-agent")),
            None => {
                eprintln!("error: {name}: an argument is not valid UTF-8");
                2
            }
        },
        _ => supervisor::cli::main(args, exe),
    };
    std::process::exit(code);
}
