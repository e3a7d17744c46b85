//! `mock-agent`: everything is in [`agents::mock`].

fn main() {
    std::process::exit(agents::mock::main(std::env::args().skip(1)));
}
