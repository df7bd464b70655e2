//! `rtrain weights`: starting weights — torchvision's published files fetched into PyTorch's
//! cache, and `.pth` state dicts converted to safetensors.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};

use super::parse_arch;
use crate::model::{weights, Arch};
use crate::util::files;

#[derive(Debug, Subcommand)]
pub enum WeightsCommand {
    /// Download torchvision's published weights into PyTorch's cache ($TORCH_HOME/hub/checkpoints),
    /// checked against the sha256 prefix in their file name; a file already there is checked.
    Fetch(WeightsFetchArgs),
    /// Write a `torch.save` state dict (.pth) as safetensors, tensor for tensor.
    Convert(ConvertArgs),
}

impl WeightsCommand {
    pub(super) fn run(self) -> Result<()> {
        match self {
            WeightsCommand::Fetch(args) => args.run(),
            WeightsCommand::Convert(args) => args.run(),
        }
    }
}

#[derive(Debug, Args)]
pub struct WeightsFetchArgs {
    #[arg(value_parser = parse_arch)]
    arch: Arch,
    /// torchvision's weights name (IMAGENET1K_V1, IMAGENET1K_V2), DEFAULT (the newest), or a
    /// file name in torch.hub's form NAME-SHA256PREFIX.pth on the server.
    #[arg(long, default_value = "DEFAULT")]
    weights: String,
    /// Download from this server instead of torchvision's (a mirror).
    #[arg(long, default_value = weights::TORCHVISION_BASE_URL)]
    base_url: String,
}

impl WeightsFetchArgs {
    fn run(self) -> Result<()> {
        let file = weights::HubFile::resolve(self.arch, &self.weights)?;
        let path = weights::fetch_to_cache(self.arch, &file, &self.base_url, true)?;
        println!("{} {}: {} (sha256 starts {})", self.arch, file.name, path.display(), file.sha256_prefix());
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct ConvertArgs {
    input: PathBuf,
    output: PathBuf,
}

impl ConvertArgs {
    fn run(self) -> Result<()> {
        let tensors = weights::read_state_dict(&self.input)?;
        let named: Vec<(String, tch::Tensor)> = tensors.into_iter().collect();
        files::write_safetensors(&self.output, &named, None)?;
        println!("{}: {} tensors from {}", self.output.display(), named.len(), self.input.display());
        Ok(())
    }
}
