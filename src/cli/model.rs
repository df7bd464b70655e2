//! The commands that use a trained model from its checkpoint: `rtrain eval` (the validation
//! split), `rtrain predict` (image files) and `rtrain export` (a torchvision state dict).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::{print, ConfigArgs};
use crate::predict;
use crate::run_dir::checkpoint;
use crate::train::eval;

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[arg(long)]
    pub checkpoint: PathBuf,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

impl EvalArgs {
    pub(super) fn run(self) -> Result<()> {
        let config = self.config.load()?.config;
        let (report, classes) = eval::evaluate_checkpoint(&config, &self.checkpoint)?;
        print::eval_report(&report, &classes, self.json)
    }
}

#[derive(Debug, Args)]
pub struct PredictArgs {
    #[arg(long)]
    pub checkpoint: PathBuf,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// How many classes to show per image.
    #[arg(long, default_value_t = 3)]
    pub top: usize,
    #[arg(long)]
    pub json: bool,
    #[arg(required = true)]
    pub images: Vec<PathBuf>,
}

impl PredictArgs {
    pub(super) fn run(self) -> Result<()> {
        let config = self.config.load()?.config;
        let predictions = predict::predict_files(&config, &self.checkpoint, &self.images, self.top)?;
        print::predictions(&predictions, self.json)
    }
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[arg(long)]
    pub checkpoint: PathBuf,
    pub out: PathBuf,
}

impl ExportArgs {
    pub(super) fn run(self) -> Result<()> {
        let (model, meta) = checkpoint::load_model(&self.checkpoint)?;
        model.write_torchvision(&self.out, meta.global_step, Some(meta.to_metadata()))?;
        println!(
            "{}: torchvision {} state dict, num_classes={} ({})",
            self.out.display(),
            meta.arch,
            meta.num_classes,
            meta.classes.join(", ")
        );
        Ok(())
    }
}
