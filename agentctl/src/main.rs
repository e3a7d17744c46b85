//! The `agentctl` binary: everything is in [`agentctl::cli`].

fn main() {
    // Arguments as the OS gave them: one that is not UTF-8 is a usage error, not a panic.
    let args: Option<Vec<String>> =
        std::env::args_os().skip(1).map(|arg| arg.into_string().ok()).collect();
    let Some(args) = args else {
        eprintln!("agentctl: an argument is not valid UTF-8");
        std::process::exit(2);
    };
    let own = std::env::current_exe().map(|path| vec![path.into_os_string()]).unwrap_or_default();
    std::process::exit(agentctl::cli::run(&args, own));
}
