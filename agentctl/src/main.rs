//! The `agentctl` binary: everything is in [`agentctl::cli`].

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let own = std::env::current_exe().map(|path| vec![path.into_os_string()]).unwrap_or_default();
    std::process::exit(agentctl::cli::run(&args, own));
}
