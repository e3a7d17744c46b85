//! `mock-agent`: parse the command line and run [`agents::mock`] on stdio.

use agents::mock::{self, Invocation};

fn main() {
    let invocation = match mock::parse_args(std::env::args().skip(1)) {
        Ok(invocation) => invocation,
        Err(reason) => {
            eprintln!("mock-agent: {reason}\n\n{}", mock::USAGE);
            std::process::exit(2);
        }
    };
    let config = match invocation {
        Invocation::Help => {
            print!("{}", mock::USAGE);
            return;
        }
        Invocation::Run(config) => config,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("UNWRAP: a current-thread runtime needs no resources that can be missing");
    let code = runtime.block_on(mock::run(config));
    std::process::exit(code);
}
