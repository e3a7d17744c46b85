//! `mock-agent`: everything is in [`agents::mock`].

fn main() {
    let own = std::env::current_exe().map(|path| vec![path.into_os_string()]).unwrap_or_default();
    std::process::exit(agents::mock::main(std::env::args().skip(1), own));
}
