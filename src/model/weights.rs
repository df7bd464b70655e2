//! Starting weights: torchvision's published ImageNet weights by name (`model.weights`), and
//! reading `torch.save` state dicts (`.pth`) beside safetensors.
//!
//! Published weights are cached where PyTorch caches them (`$TORCH_HOME/hub/checkpoints`), under
//! torchvision's file names, so a file torchvision already downloaded is used as is, and a login
//! node with internet can fill the cache for compute nodes without. A download is checked as
//! torch.hub checks it: the hexadecimal part of the file name is the start of its sha256.
//!
//! `.pth` files are read by the `pytorch-reader` crate, never by an unpickler that runs what a
//! pickle names: it builds only tensors, checks every length the file declares (storages
//! against their records, each tensor's size, stride and offset against its storage, pickle
//! nesting and copies) before it allocates, and reads both `torch.save` formats (the zip
//! archive of PyTorch 1.6 and later, and the legacy stream before it). What it leaves to us is
//! what a state dict must be to become weights: at least one tensor, names that survive as
//! safetensors keys, and no tensor larger than the file it came from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::model::Arch;
use crate::util::fetch::{self, FetchError, FetchOptions};
use crate::util::files::{self, FileError};

/// Where torchvision publishes its weights; `model.weights_url` replaces it (a mirror, or a
/// test's loopback server).
pub const TORCHVISION_BASE_URL: &str = "https://download.pytorch.org/models/";

/// One of torchvision's published weight files: `ResNet34_Weights.IMAGENET1K_V1` is
/// `(Resnet34, "IMAGENET1K_V1", "resnet34-b627a593.pth")`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub arch: Arch,
    /// torchvision's enum member name.
    pub name: &'static str,
    /// The file name, whose part after the last '-' is the start of its sha256.
    pub file: &'static str,
}

/// torchvision 0.28's ResNet weights (`torchvision.models.ResNet*_Weights`); the test
/// `published_weights_match_torchvision` compares this table with torchvision's.
pub const PUBLISHED: &[Published] = &[
    Published { arch: Arch::Resnet18, name: "IMAGENET1K_V1", file: "resnet18-f37072fd.pth" },
    Published { arch: Arch::Resnet34, name: "IMAGENET1K_V1", file: "resnet34-b627a593.pth" },
    Published { arch: Arch::Resnet50, name: "IMAGENET1K_V1", file: "resnet50-0676ba61.pth" },
    Published { arch: Arch::Resnet50, name: "IMAGENET1K_V2", file: "resnet50-11ad3fa6.pth" },
    Published { arch: Arch::Resnet101, name: "IMAGENET1K_V1", file: "resnet101-63fe2227.pth" },
    Published { arch: Arch::Resnet101, name: "IMAGENET1K_V2", file: "resnet101-cd907fc2.pth" },
    Published { arch: Arch::Resnet152, name: "IMAGENET1K_V1", file: "resnet152-394f9c45.pth" },
    Published { arch: Arch::Resnet152, name: "IMAGENET1K_V2", file: "resnet152-f82ba261.pth" },
];

impl Published {
    /// torchvision's weights `name` for `arch`; "DEFAULT" is the newest, as in torchvision.
    pub fn find(arch: Arch, name: &str) -> Option<Published> {
        let mut for_arch = PUBLISHED.iter().filter(|p| p.arch == arch);
        match name {
            "DEFAULT" => for_arch.next_back().copied(),
            _ => for_arch.find(|p| p.name == name).copied(),
        }
    }
}

/// A weights file in torch.hub's naming, `STEM-HASH.pth`, where HASH is the start of the
/// file's sha256: torchvision's published weights, or others served the same way (a mirror
/// with a group's own weights).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubFile {
    /// What `model.weights` said: torchvision's name (`IMAGENET1K_V1`) or the file name.
    pub name: String,
    pub file: String,
}

impl HubFile {
    /// `model.weights` for `arch`: torchvision's name (or DEFAULT), or a hub file name.
    pub fn resolve(arch: Arch, name: &str) -> Result<HubFile, WeightsError> {
        if let Some(published) = Published::find(arch, name) {
            return Ok(HubFile { name: published.name.to_string(), file: published.file.to_string() });
        }
        let file = HubFile { name: name.to_string(), file: name.to_string() };
        if name.ends_with(".pth") && !name.contains('/') && file.sha256_prefix().len() >= 8 {
            return Ok(file);
        }
        let known = PUBLISHED.iter().filter(|p| p.arch == arch).map(|p| p.name).collect::<Vec<_>>();
        Err(WeightsError::UnknownName { arch, name: name.to_string(), known: known.join(", ") })
    }

    /// The sha256 prefix in the file name (torch.hub's `HASH_REGEX`, `-([a-f0-9]*)\.`): empty
    /// when the name has none.
    pub fn sha256_prefix(&self) -> &str {
        let stem = self.file.strip_suffix(".pth").unwrap_or(&self.file);
        let hash = stem.rsplit_once('-').map_or("", |(_, hash)| hash);
        if hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            hash
        } else {
            ""
        }
    }

    pub fn url(&self, base_url: &str) -> String {
        format!("{}/{}", base_url.trim_end_matches('/'), self.file)
    }
}

/// What a run started from, for its manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartingWeights {
    /// torchvision's weights name (`IMAGENET1K_V1`), or None for a file given by path.
    pub name: Option<String>,
    /// Where the file was (or would be) downloaded from, for published weights.
    pub url: Option<String>,
    pub path: PathBuf,
    pub sha256: String,
}

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error(
        "weights {name:?}: torchvision publishes no such weights for {arch} (it has: {known}, or DEFAULT), \
         and it is not a file name in torch.hub's form NAME-SHA256PREFIX.pth"
    )]
    UnknownName { arch: Arch, name: String, known: String },
    #[error(
        "{}: {arch} weights {name} are not in the cache and could not be downloaded from {url}: {source}. \
         On a machine with internet run `rtrain weights fetch {arch} --weights {name}` with the same \
         TORCH_HOME (or copy the file there)",
        path.display()
    )]
    NotCached { path: PathBuf, arch: Arch, name: String, url: String, source: Box<FetchError> },
    #[error("{}: cannot read it as a torch.save state dict: {problem}", path.display())]
    Pth { path: PathBuf, problem: String },
    #[error("{}: not a state dict: neither safetensors nor a file torch.save wrote ({problem})", path.display())]
    Format { path: PathBuf, problem: String },
    #[error(transparent)]
    Safetensors(#[from] FileError),
    #[error("{}: cannot {action}: {source}", path.display())]
    Io { path: PathBuf, action: &'static str, source: std::io::Error },
}

/// PyTorch's hub cache for weight files: `$TORCH_HOME/hub/checkpoints`, with TORCH_HOME
/// defaulting to `$XDG_CACHE_HOME/torch`, then `~/.cache/torch` (torch.hub's `_get_torch_home`).
pub fn cache_dir() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let torch_home = var("TORCH_HOME").unwrap_or_else(|| {
        let cache = var("XDG_CACHE_HOME")
            .unwrap_or_else(|| var("HOME").unwrap_or_else(|| PathBuf::from("/")).join(".cache"));
        cache.join("torch")
    });
    torch_home.join("hub").join("checkpoints")
}

/// The cached file of `weights`, downloaded from `base_url` first if it is not there (a file
/// there that fails its check is an error, not replaced). Safe for several processes sharing one cache: the fetcher writes a
/// `.part` file and renames only a verified one.
pub fn fetch_to_cache(
    arch: Arch,
    weights: &HubFile,
    base_url: &str,
    progress: bool,
) -> Result<PathBuf, WeightsError> {
    let path = cache_dir().join(&weights.file);
    let url = weights.url(base_url);
    let options = FetchOptions {
        sha256: weights.sha256_prefix().to_string(),
        sha256_prefix: true,
        progress,
        ..FetchOptions::default()
    };
    match fetch::fetch(&url, &path, &options) {
        Ok(fetched) => Ok(fetched.path),
        Err(source) => Err(WeightsError::NotCached {
            path,
            arch,
            name: weights.name.clone(),
            url,
            source: Box::new(source),
        }),
    }
}

/// A state dict from a safetensors file or a file `torch.save` wrote (its zip archive, or the
/// legacy stream of PyTorch before 1.6), told apart by content, not name: a safetensors file
/// starts with the length of its JSON header, then the header's `{`.
pub fn read_state_dict(path: &Path) -> Result<BTreeMap<String, Tensor>, WeightsError> {
    use std::io::Read;
    let io = |action, source| WeightsError::Io { path: path.to_path_buf(), action, source };
    let metadata = std::fs::metadata(path).map_err(|e| io("read", e))?;
    if !metadata.is_file() {
        // A FIFO or a device would be waited on or read forever.
        return Err(WeightsError::Format { path: path.to_path_buf(), problem: "not a regular file".into() });
    }
    let mut start = [0u8; 9];
    let file = std::fs::File::open(path).map_err(|e| io("open", e))?;
    let read = file.take(start.len() as u64).read(&mut start).map_err(|e| io("read", e))?;
    if read < start.len() {
        return Err(WeightsError::Format { path: path.to_path_buf(), problem: "too short".into() });
    }
    if start[8] == b'{' {
        Ok(files::read_safetensors(path)?.tensors.into_iter().collect())
    } else {
        read_pth(path, metadata.len())
    }
}

/// The tensors of a `torch.save`d state dict of `file_size` bytes, on the CPU.
fn read_pth(path: &Path, file_size: u64) -> Result<BTreeMap<String, Tensor>, WeightsError> {
    let refuse = |problem: String| WeightsError::Pth { path: path.to_path_buf(), problem };
    let reader = pytorch_reader::PytorchReader::new(path).map_err(|e| refuse(e.to_string()))?;
    if reader.is_empty() {
        return Err(refuse("it holds no tensors (an empty state dict, or no state dict at all)".into()));
    }
    let mut tensors = BTreeMap::new();
    for (name, tensor) in reader.into_tensors() {
        if name.chars().any(char::is_control) {
            // A NUL ends the name in C (two keys became one); no layer is named so.
            return Err(refuse(format!("tensor name {name:?} holds a control character")));
        }
        if name == "__metadata__" {
            return Err(refuse(
                "a tensor is named __metadata__, which safetensors keeps for its header".into(),
            ));
        }
        // A tensor can claim more bytes than its storage holds only as a view that repeats
        // elements (stride 0); no layer's weights are that, and reading it would allocate
        // what the file never held.
        if tensor.byte_len() as u64 > file_size {
            return Err(refuse(format!(
                "tensor {name:?} of shape {:?} would take {} bytes, more than the file's {file_size}",
                tensor.shape(),
                tensor.byte_len()
            )));
        }
        let kind = kind_of(tensor.dtype()).ok_or_else(|| {
            refuse(format!(
                "tensor {name:?} is of type {:?}, which libtorch has no CPU tensors of",
                tensor.dtype()
            ))
        })?;
        let bytes = tensor.read().map_err(|e| refuse(e.to_string()))?;
        let shape: Vec<i64> = tensor.shape().iter().map(|&d| d as i64).collect();
        let value = Tensor::f_from_data_size(&bytes, &shape, kind)
            .map_err(|e| refuse(format!("tensor {name:?}: {e}")))?;
        tensors.insert(name, value);
    }
    Ok(tensors)
}

/// libtorch's element type for a checkpoint's.
fn kind_of(dtype: pytorch_reader::DType) -> Option<tch::Kind> {
    use pytorch_reader::DType;
    use tch::Kind;
    Some(match dtype {
        DType::F64 => Kind::Double,
        DType::F32 => Kind::Float,
        DType::F16 => Kind::Half,
        DType::BF16 => Kind::BFloat16,
        DType::I64 => Kind::Int64,
        DType::I32 => Kind::Int,
        DType::I16 => Kind::Int16,
        DType::I8 => Kind::Int8,
        DType::U8 => Kind::Uint8,
        DType::Bool => Kind::Bool,
        DType::U16 | DType::U32 | DType::U64 => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_per_architecture_and_default_is_the_newest() {
        let r34 = HubFile::resolve(Arch::Resnet34, "IMAGENET1K_V1").unwrap();
        assert_eq!(r34.sha256_prefix(), "b627a593");
        assert_eq!(r34.url("http://127.0.0.1:9/m/"), "http://127.0.0.1:9/m/resnet34-b627a593.pth");
        assert_eq!(HubFile::resolve(Arch::Resnet50, "DEFAULT").unwrap().name, "IMAGENET1K_V2");
        let err = HubFile::resolve(Arch::Resnet34, "IMAGENET1K_V2").unwrap_err().to_string();
        assert!(err.contains("IMAGENET1K_V1") && err.contains("resnet34"), "{err}");
        let own = HubFile::resolve(Arch::Resnet18, "mine-0123abcd.pth").unwrap();
        assert_eq!((own.sha256_prefix(), own.file.as_str()), ("0123abcd", "mine-0123abcd.pth"));
        for bad in ["mine.pth", "mine-0123abc.pth", "mine-0123abcz.pth", "../x-0123abcd.pth", "x-0123abcd.pt"]
        {
            assert!(HubFile::resolve(Arch::Resnet18, bad).is_err(), "{bad}");
        }
    }
}
