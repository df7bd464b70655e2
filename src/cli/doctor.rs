//! `rtrain doctor`: prints what the process sees (libtorch, CPU, CUDA, precision) and fails
//! when it finds a problem, so that a container's `%test` or a job's first step can stop.

use anyhow::{bail, Result};
use clap::Args;

use super::ConfigArgs;
use crate::doctor;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[arg(long)]
    pub json: bool,
}

impl DoctorArgs {
    pub(super) fn run(self) -> Result<()> {
        let examination = doctor::examine(&self.config.load()?.config);
        match self.json {
            true => println!("{}", serde_json::to_string_pretty(&examination.to_json())?),
            false => print!("{}", examination.render()),
        }
        // The report is printed either way; the exit status lets scripts (apptainer.def's
        // %test, a job's first step) stop on a problem.
        match examination.problems.len() {
            0 => Ok(()),
            n => bail!("doctor found {n} problem(s); each is printed above with its fix"),
        }
    }
}
