//! The commands over finished run directories: `rtrain report` (report.md, plots and CSV, or
//! the scaling table over runs), `rtrain publish` (a bundle for an archive) and `rtrain verify`
//! (a run's files against its manifest.json, or a bundle's against its checksums).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use super::print;
use crate::publish::{self, Authorship};
use crate::report::{self, projection, runs::RunData, scaling};
use crate::run_dir::manifest;
use crate::run_dir::RunPaths;
use crate::util::files;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// How training scales: time per epoch, img/s, speed-up and efficiency against the run
    /// with the fewest ranks, and why: each run's phases, the lost efficiency by cause, the
    /// straggler, a projection to more ranks (printed; no report directory).
    #[arg(long)]
    pub scaling: bool,
    /// Run directories (each with metrics.jsonl; manifest.json and summary.json where present).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Where report.md, the plots and the CSV go (default: RUN_DIR/report for one run,
    /// ./report for several).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// --scaling: also write the plot (SVG) here, and the phases of each run's step as stacked
    /// bars beside it (`<plot stem>-phases.svg` and `.png`).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// --scaling: the bandwidth of the links between nodes in Gbit/s, for the projection to
    /// more nodes (default: as measured in the largest run with several ranks).
    #[arg(long, value_name = "GBIT_PER_S")]
    pub link_gbit: Option<f64>,
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
        if let Some(gbit) = self.link_gbit.filter(|g| !(g.is_finite() && *g > 0.0)) {
            bail!("--link-gbit {gbit}: the bandwidth must be a positive number of Gbit/s");
        }
        let projection = projection::project(&rows, self.link_gbit);
        match self.json {
            true => println!("{}", serde_json::to_string_pretty(&rows)?),
            false => {
                print!("{}", scaling::table(&rows));
                println!();
                print!("{}", scaling::breakdown_table(&rows));
                println!();
                match &projection {
                    Some(projection) => print!("{}", projection::describe(projection)),
                    None => println!(
                        "Projection: needs phase timings, the gradient bytes (summary.json) and a bandwidth \
                         (--link-gbit, or a run with several ranks)."
                    ),
                }
            }
        }
        if let Some(plot) = &self.plot {
            files::write_atomic(plot, scaling::svg(&rows)?.as_bytes())?;
            eprintln!("plot: {}", plot.display());
            let stem = plot.with_extension("");
            let stem = PathBuf::from(format!("{}-phases", stem.display()));
            let projected = projection.as_ref().map(projection::bars).unwrap_or_default();
            if let Some((svg, png)) = scaling::phase_bars(&stem, &rows, projected)? {
                eprintln!("phases: {} and {}", svg.display(), png.display());
            }
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A run directory, or a bundle `rtrain publish` wrote (it has ro-crate-metadata.json).
    pub run_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    /// Finished run directories (seeds of one configuration, or several configurations).
    #[arg(required_unless_present = "seal")]
    pub runs: Vec<PathBuf>,
    /// The bundle to write (a new directory, or an empty one).
    #[arg(long, required_unless_present = "seal")]
    pub out: Option<PathBuf>,
    /// The model's title (default: architecture, number of classes and of runs).
    #[arg(long)]
    pub title: Option<String>,
    /// An author, "Given Family" or "Given Family <ORCID URL>" (repeatable, in citation
    /// order; default: a placeholder).
    #[arg(long = "author", value_name = "NAME")]
    pub authors: Vec<String>,
    /// The weights' licence as an SPDX identifier, e.g. CC-BY-4.0 (default: a placeholder).
    #[arg(long, value_name = "SPDX", value_parser = parse_spdx)]
    pub license: Option<String>,
    /// The authors' organisation, "NAME <URL>" with its ROR URL or homepage (default: a
    /// placeholder).
    #[arg(long, value_name = "ORG")]
    pub affiliation: Option<String>,
    /// Who publishes the bundle, "NAME <URL>", e.g. "Zenodo <https://zenodo.org>" (default: a
    /// placeholder).
    #[arg(long, value_name = "ORG")]
    pub publisher: Option<String>,
    /// Seal a bundle again after filling in its MODEL_CARD.md or CITATION.cff: rewrite the
    /// sha256 of every file in ro-crate-metadata.json and SHA256SUMS.
    #[arg(long, value_name = "BUNDLE", conflicts_with_all = ["runs", "out", "title", "authors", "license", "affiliation", "publisher"])]
    pub seal: Option<PathBuf>,
}

fn parse_spdx(id: &str) -> Result<String, String> {
    match !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c)) {
        true => Ok(id.to_string()),
        false => Err(format!("{id:?} is not an SPDX licence identifier (e.g. CC-BY-4.0, MIT, Apache-2.0)")),
    }
}

impl PublishArgs {
    pub(super) fn run(self) -> Result<()> {
        if let Some(bundle) = &self.seal {
            let files = publish::seal(bundle)?;
            println!("{}: sealed ({files} files re-hashed)", bundle.display());
            return Ok(());
        }
        let Some(out) = &self.out else { bail!("--out is required") };
        let authorship = Authorship {
            title: self.title,
            authors: self.authors,
            license: self.license,
            affiliation: self.affiliation,
            publisher: self.publisher,
        };
        let bundle = match publish::publish(&self.runs, out, authorship) {
            Err(publish::PublishError::Stopped) => {
                let what = format!("publish into {} (nothing written)", out.display());
                return Err(crate::cluster::signals::StoppedBySignal { what }.into());
            }
            published => published?,
        };
        let card = out.join(publish::MODEL_CARD);
        let placeholders = std::fs::read_to_string(&card).map_or(0, |text| text.matches("[AUTHOR]").count());
        println!("{}", out.display());
        eprintln!(
            "published {} run(s); {} places in {} are for the author (then: rtrain publish --seal {})",
            bundle.runs.len(),
            placeholders,
            card.display(),
            out.display()
        );
        Ok(())
    }
}

impl VerifyArgs {
    pub(super) fn run(self) -> Result<()> {
        if publish::is_bundle(&self.run_dir) {
            let findings = publish::verify(&self.run_dir)?;
            let bad = print::verify_findings(&findings);
            if bad > 0 {
                bail!("{}: {bad} finding(s): the bundle is not as it was published", self.run_dir.display());
            }
            return Ok(());
        }
        let findings = manifest::verify(&self.run_dir)?;
        let bad = print::verify_findings(&findings);
        if bad > 0 {
            let manifest = RunPaths::new(&self.run_dir).manifest();
            bail!("{}: {bad} file(s) differ from {}", self.run_dir.display(), manifest.display());
        }
        Ok(())
    }
}
