//! TensorBoard event files in `RUN_DIR/tensorboard/` (`log.tensorboard`), written by global
//! rank 0 record by record as `metrics.jsonl` is, so that `tensorboard --logdir` shows a running
//! job: each logged step's loss, accuracy, learning rate and img/s (`train/*`), each epoch's
//! training and validation metrics (`epoch/*`, `val/*`) and validation confusion matrix (an
//! image, `val/confusion`), all at the global step; the resolved configuration as text at step 0.
//!
//! The format is TensorFlow's: TFRecord framing (length as u64 little-endian, its masked
//! CRC-32C, the bytes, their masked CRC-32C) of `tensorflow.Event` protobufs, of which the few
//! fields written are declared here for prost. A resumed run rewrites the file from the
//! records `metrics.jsonl` kept, so no reader sees a step twice.

use std::fs::{File, OpenOptions};
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use prost::Message;

use super::records::{EpochRecord, MetricsRecord, StepRecord};
use crate::plot;
use crate::util::files::{self, FileError};

/// The part of TensorFlow's protobufs (event.proto, summary.proto, tensor.proto) rtrain writes.
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Event {
        #[prost(double, tag = "1")]
        pub wall_time: f64,
        #[prost(int64, tag = "2")]
        pub step: i64,
        #[prost(oneof = "What", tags = "3, 5")]
        pub what: Option<What>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum What {
        #[prost(string, tag = "3")]
        FileVersion(String),
        #[prost(message, tag = "5")]
        Summary(Summary),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Summary {
        #[prost(message, repeated, tag = "1")]
        pub value: Vec<Value>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Value {
        #[prost(string, tag = "1")]
        pub tag: String,
        #[prost(message, optional, tag = "9")]
        pub metadata: Option<SummaryMetadata>,
        #[prost(oneof = "Kind", tags = "2, 4, 8")]
        pub kind: Option<Kind>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(float, tag = "2")]
        SimpleValue(f32),
        #[prost(message, tag = "4")]
        Image(Image),
        #[prost(message, tag = "8")]
        Tensor(TensorProto),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Image {
        #[prost(int32, tag = "1")]
        pub height: i32,
        #[prost(int32, tag = "2")]
        pub width: i32,
        #[prost(int32, tag = "3")]
        pub colorspace: i32,
        #[prost(bytes = "vec", tag = "4")]
        pub encoded_image_string: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SummaryMetadata {
        #[prost(message, optional, tag = "1")]
        pub plugin_data: Option<PluginData>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PluginData {
        #[prost(string, tag = "1")]
        pub plugin_name: String,
        #[prost(bytes = "vec", tag = "2")]
        pub content: Vec<u8>,
    }

    /// A scalar string tensor (dtype DT_STRING, no dimensions): the text plugin's input.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorProto {
        #[prost(int32, tag = "1")]
        pub dtype: i32,
        #[prost(message, optional, tag = "2")]
        pub tensor_shape: Option<TensorShapeProto>,
        #[prost(bytes = "vec", repeated, tag = "8")]
        pub string_val: Vec<Vec<u8>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorShapeProto {}

    pub const DT_STRING: i32 = 7;
}

/// An event file's name as rtrain writes it: TensorBoard's prefix, the time and host, and a
/// suffix of its own (TensorBoard reads any name that holds `tfevents`).
const EVENTS_PREFIX: &str = "events.out.tfevents.";
const EVENTS_SUFFIX: &str = ".rtrain";

/// Whether `name` is an event file rtrain writes: what `rtrain publish` carries of a run's
/// `tensorboard/` and `train --overwrite` deletes there, and nothing else (another tool's event
/// files, another run's directory).
pub fn is_event_file(name: &str) -> bool {
    name.strip_prefix(EVENTS_PREFIX).and_then(|rest| rest.strip_suffix(EVENTS_SUFFIX)).is_some()
}

/// The directory's event file, open for appending.
pub struct EventFile {
    path: PathBuf,
    file: File,
    images: ConfusionImages,
}

impl EventFile {
    /// Replaces the event files in `dir` with one holding the configuration text and `records`
    /// (what `metrics.jsonl` holds: a resumed run's records before its resume point), written
    /// atomically; later records are appended. `classes` label the confusion images.
    pub fn create(
        dir: &Path,
        config_toml: &str,
        classes: &[String],
        records: &[MetricsRecord],
    ) -> Result<EventFile, FileError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| FileError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let wall_time = now();
        let host = crate::cluster::hostname();
        let path = dir.join(format!("{EVENTS_PREFIX}{}.{host}{EVENTS_SUFFIX}", wall_time as u64));
        let mut images = ConfusionImages { classes: classes.to_vec(), failed: false };
        let mut bytes = Vec::new();
        let version = proto::What::FileVersion("brain.Event:2".into());
        frame(&mut bytes, &proto::Event { wall_time, step: 0, what: Some(version) });
        frame(&mut bytes, &summary(0, vec![text("config", config_toml)]));
        for record in records {
            frame_record(&mut bytes, &mut images, record);
        }
        files::write_atomic(&path, &bytes)?;
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let old = entry.map_err(io(dir))?.path();
            // Only rtrain's own: another tool's event files beside them are not the run's.
            let name = old.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if is_event_file(&name) && old != path {
                std::fs::remove_file(&old).map_err(io(&old))?;
            }
        }
        let file = OpenOptions::new().append(true).open(&path).map_err(io(&path))?;
        Ok(EventFile { path, file, images })
    }

    /// Appends one record's events; written through to the file at once (no buffer).
    pub fn append(&mut self, record: &MetricsRecord) -> Result<(), FileError> {
        let mut bytes = Vec::new();
        frame_record(&mut bytes, &mut self.images, record);
        self.file.write_all(&bytes).map_err(|source| FileError::Io { path: self.path.clone(), source })
    }
}

/// Draws each epoch's validation confusion matrix (by true class) as a PNG summary.
struct ConfusionImages {
    classes: Vec<String>,
    /// Set once an image could not be drawn (no font), so that it is said once.
    failed: bool,
}

impl ConfusionImages {
    fn of(&mut self, record: &EpochRecord) -> Option<proto::Value> {
        if self.failed {
            return None;
        }
        let title = format!("Validation confusion by true class, epoch {}", record.epoch + 1);
        let classes: Vec<String> = (0..record.val.confusion.len())
            .map(|i| self.classes.get(i).cloned().unwrap_or_else(|| i.to_string()))
            .collect();
        let drawn = plot::confusion_image(&title, &classes, &record.val.confusion, plot::Cells::RowShares)
            .map_err(|e| e.to_string())
            .and_then(|picture| {
                let mut png = Vec::new();
                picture
                    .write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png)
                    .map_err(|e| e.to_string())?;
                Ok((picture.width(), picture.height(), png))
            });
        match drawn {
            Ok((width, height, png)) => Some(proto::Value {
                tag: "val/confusion".into(),
                metadata: None,
                kind: Some(proto::Kind::Image(proto::Image {
                    height: height as i32,
                    width: width as i32,
                    colorspace: 3,
                    encoded_image_string: png,
                })),
            }),
            Err(problem) => {
                self.failed = true;
                tracing::warn!("TensorBoard: no confusion images ({problem}); the scalars are written");
                None
            }
        }
    }
}

/// The events of one `metrics.jsonl` record, framed onto `bytes`.
fn frame_record(bytes: &mut Vec<u8>, images: &mut ConfusionImages, record: &MetricsRecord) {
    let event = match record {
        MetricsRecord::Step(step) => summary(step.global_step, step_scalars(step)),
        MetricsRecord::Epoch(epoch) => {
            let mut values = epoch_scalars(epoch);
            values.extend(images.of(epoch));
            summary(epoch.global_step, values)
        }
    };
    frame(bytes, &event);
}

/// The tags and values of a step record, as TensorBoard shows them.
fn step_scalars(step: &StepRecord) -> Vec<proto::Value> {
    [
        ("train/loss", step.loss),
        ("train/accuracy", step.accuracy),
        ("train/lr", step.lr),
        ("train/images_per_second", step.images_per_second),
    ]
    .into_iter()
    .map(|(tag, value)| scalar(tag, value))
    .collect()
}

/// The tags and values of an epoch record (`epoch/epoch` is 1-based).
fn epoch_scalars(epoch: &EpochRecord) -> Vec<proto::Value> {
    let val = &epoch.val;
    let mut values = vec![
        ("epoch/epoch", f64::from(epoch.epoch + 1)),
        ("epoch/train_loss", epoch.train_loss),
        ("epoch/train_accuracy", epoch.train_accuracy),
        ("epoch/train_images_per_second", epoch.train_images_per_second),
        ("epoch/seconds", epoch.seconds),
        ("epoch/lr", epoch.lr),
        ("val/loss", val.loss),
        ("val/top1", val.top1),
        ("val/macro_f1", val.ordinal.macro_f1),
        ("val/balanced_accuracy", val.ordinal.balanced_accuracy),
        ("val/mean_rank_error", val.ordinal.mean_rank_error),
    ];
    values.extend(val.ordinal.quadratic_kappa.map(|k| ("val/quadratic_kappa", k)));
    values.into_iter().map(|(tag, value)| scalar(tag, value)).collect()
}

fn scalar(tag: &str, value: f64) -> proto::Value {
    proto::Value { tag: tag.into(), metadata: None, kind: Some(proto::Kind::SimpleValue(value as f32)) }
}

fn text(tag: &str, text: &str) -> proto::Value {
    proto::Value {
        tag: tag.into(),
        metadata: Some(proto::SummaryMetadata {
            plugin_data: Some(proto::PluginData { plugin_name: "text".into(), content: Vec::new() }),
        }),
        kind: Some(proto::Kind::Tensor(proto::TensorProto {
            dtype: proto::DT_STRING,
            tensor_shape: Some(proto::TensorShapeProto {}),
            string_val: vec![text.as_bytes().to_vec()],
        })),
    }
}

fn summary(step: u64, value: Vec<proto::Value>) -> proto::Event {
    proto::Event {
        wall_time: now(),
        step: step as i64,
        what: Some(proto::What::Summary(proto::Summary { value })),
    }
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// One TFRecord: length, masked CRC-32C of the length, data, masked CRC-32C of the data.
fn frame(bytes: &mut Vec<u8>, event: &proto::Event) {
    let data = event.encode_to_vec();
    let length = (data.len() as u64).to_le_bytes();
    bytes.extend_from_slice(&length);
    bytes.extend_from_slice(&masked_crc(&length).to_le_bytes());
    bytes.extend_from_slice(&data);
    bytes.extend_from_slice(&masked_crc(&data).to_le_bytes());
}

/// TFRecord's masked CRC-32C (Castagnoli): rotated right by 15 bits, plus a constant.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_is_castagnolis_and_masked_as_tensorflow_masks_it() {
        // CRC-32C of "123456789" is 0xE3069283 (RFC 3720's check value).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xE306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8));
    }
}
