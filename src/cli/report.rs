//! The commands over finished run directories: `rtrain report` (report.md, plots and CSV, or
//! the scaling table over runs) and `rtrain verify` (a run's files against its manifest.json).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use super::print;
use crate::report::{self, runs::RunData, scaling};
use crate::run_dir::manifest;
use crate::run_dir::RunPaths;
use crate::util::files;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// How training scales: time per epoch, img/s, speed-up and efficiency against the run
    /// with the fewest ranks (printed; no report directory).
    #[arg(long)]
    pub scaling: bool,
    /// Run directories (each with metrics.jsonl; manifest.json and summary.json where present).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Where report.md, the plots and the CSV go (default: RUN_DIR/report for one run,
    /// ./report for several).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// --scaling: also write the plot (SVG) here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// --scaling: print JSON.
    #[arg(long)]
    pub json: bool,
    /// A configuration key (`section.key`, repeatable) whose values do not make runs differ
    /// for the seed statistics, beside `run.seed`, `run.name` and `run.dir`: e.g. `train.threads`.
    #[arg(long = "ignore-key", value_name = "KEY")]
    pub ignore_keys: Vec<String>,
}

impl ReportArgs {
    pub(super) fn run(self) -> Result<()> {
        match self.scaling {
            true => self.print_scaling(),
            false => self.write_report(),
        }
    }

    fn out(&self) -> PathBuf {
        match (&self.out, self.runs.as_slice()) {
            (Some(out), _) => out.clone(),
            (None, [one]) => RunPaths::new(one).report(),
            (None, _) => PathBuf::from("report"),
        }
    }

    fn write_report(&self) -> Result<()> {
        let runs = self.runs.iter().map(|dir| RunData::read(dir)).collect::<Result<Vec<_>, _>>()?;
        let out = self.out();
        // A run directory from elsewhere may hold `report` as a link to anywhere: the default
        // output stays inside the run. (An --out the user names is theirs to point anywhere.)
        if self.out.is_none() {
            if let Ok(meta) = out.symlink_metadata() {
                if !meta.is_dir() {
                    let what =
                        if meta.file_type().is_symlink() { "a symbolic link" } else { "not a directory" };
                    bail!("{} is {what}: the report is written only inside the run; remove it, or name an --out", out.display());
                }
            }
        }
        println!("{}", report::runs::write(&runs, &out, &self.ignore_keys)?.display());
        Ok(())
    }

    fn print_scaling(&self) -> Result<()> {
        let rows = scaling::scaling(&self.runs)?;
        match self.json {
            true => println!("{}", serde_json::to_string_pretty(&rows)?),
            false => print!("{}", scaling::table(&rows)),
        }
        if let Some(plot) = &self.plot {
            files::write_atomic(plot, scaling::svg(&rows)?.as_bytes())?;
            eprintln!("plot: {}", plot.display());
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    pub run_dir: PathBuf,
}

impl VerifyArgs {
    pub(super) fn run(self) -> Result<()> {
        let findings = manifest::verify(&self.run_dir)?;
        let bad = print::verify_findings(&findings);
        if bad > 0 {
            let manifest = RunPaths::new(&self.run_dir).manifest();
            bail!("{}: {bad} file(s) differ from {}", self.run_dir.display(), manifest.display());
        }
        Ok(())
    }
}
