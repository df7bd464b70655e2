//! The `rtrain` binary: parse, dispatch, and map errors to exit codes (2 for usage and
//! configuration errors, 75 for a run stopped by a signal after its checkpoint, 1 for any other
//! failure).

use std::process::ExitCode;

use clap::Parser;
use rtrain::cli::{self, Cli};

fn main() -> ExitCode {
    rtrain::util::memory::tune_allocator_for_training();
    let cli = Cli::parse();
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", rtrain::util::logging::describe_error(&error));
            ExitCode::from(cli::exit_code(&error))
        }
    }
}
