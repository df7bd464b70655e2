//! `rtrain explain` against the `grad-cam` package (pytorch-grad-cam): the same torchvision
//! model (rtrain's checkpoint as `rtrain export` writes it, with the tutorial's MLP head), the
//! same photo (preprocessed by torchvision there, and equal to the `input` explain stores
//! beside each map) and the same class (given, or torchvision's prediction) give the same map
//! before upsampling, within 1e-4 once both are normalised to [0, 1];
//! tests/reference/gradcam_reference.py runs the package.

mod common;

use std::path::{Path, PathBuf};

use rtrain::model::{Arch, Model};
use rtrain::run_dir::checkpoint;
use rtrain::util::files::read_safetensors;
use tch::{Device, Kind, Tensor};

const CLASSES: [&str; 3] = ["C0", "C2", "C4"];

/// A checkpoint of a fresh `arch` with an MLP head of `head_hidden`, its BatchNorm statistics
/// moved away from 0/1 so that evaluation mode differs from training mode.
fn checkpoint_of(dir: &Path, arch: Arch, head_hidden: &[usize]) -> PathBuf {
    // libtorch's generator is one per process and the tests run on parallel threads: without
    // the lock another test's draws interleave and the weights (and how far the map's range
    // stands above fp32 rounding) change from run to run.
    static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _seeded = SEEDED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    tch::manual_seed(5);
    let model = Model::with_head(arch, CLASSES.len(), head_hidden, Device::Cpu).unwrap();
    tch::no_grad(|| {
        for _ in 0..2 {
            let _ = model.forward_t(&(Tensor::randn([4, 3, 64, 64], (Kind::Float, Device::Cpu)) + 0.3), true);
        }
    });
    let classes = CLASSES.iter().map(|c| c.to_string()).collect();
    let meta = common::checkpoint_meta(arch, classes, head_hidden, 2, 224);
    let path = dir.join(format!("{arch}.safetensors"));
    checkpoint::save(&path, &meta, model.state_dict().into_iter().collect(), vec![]).unwrap();
    path
}

/// Photos with structure for the model to respond to: noise over a bright square whose place
/// depends on `seed`, in a size the evaluation transform resizes and crops.
fn photos(dir: &Path, count: u32) -> Vec<PathBuf> {
    (0..count)
        .map(|seed| {
            let mut state = 0x9E37_79B9u32.wrapping_mul(seed + 1);
            let (x0, y0) = (40 + 50 * (seed % 3), 30 + 60 * (seed % 2));
            let picture = image::RgbImage::from_fn(300, 260, |x, y| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let noise = (state >> 24) as u8 / 2;
                let inside = (x0..x0 + 90).contains(&x) && (y0..y0 + 90).contains(&y);
                if inside {
                    image::Rgb([255 - noise / 4, 200, 40 + noise])
                } else {
                    image::Rgb([noise, noise / 2 + 60, 90])
                }
            });
            let path = dir.join(format!("photo {seed}.png"));
            picture.save(&path).unwrap();
            path
        })
        .collect()
}

/// Explains `images` with rtrain, then with pytorch-grad-cam, and compares every map and the
/// probabilities.
fn matches_pytorch_grad_cam(arch: Arch, head_hidden: &[usize], layer: &str, class: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint_of(dir.path(), arch, head_hidden);
    let images = photos(dir.path(), 3);
    let out = dir.path().join("explained");
    let mut command = common::rtrain(dir.path());
    command.args(["explain", "--checkpoint"]).arg(&ckpt).args(["--out"]).arg(&out);
    command.args(["--layer", layer, "--set", "train.threads=1", "--set", "data.image_size=224"]);
    if let Some(class) = class {
        command.args(["--class", class]);
    }
    let output = command.args(&images).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    let index = std::fs::read_to_string(out.join("index.csv")).unwrap();
    let mut rows = csv::Reader::from_reader(index.as_bytes());
    let rows: Vec<csv::StringRecord> = rows.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), images.len(), "{index}");
    let maps: Vec<PathBuf> = rows.iter().map(|row| out.join(&row[8])).collect();

    let weights = dir.path().join("torchvision.safetensors");
    common::rtrain(dir.path()).args(["export", "--checkpoint"]).arg(&ckpt).arg(&weights).assert().success();
    let theirs_path = dir.path().join("theirs.safetensors");
    let hidden = head_hidden.iter().map(|w| w.to_string()).collect::<Vec<_>>().join(",");
    // The class by index, or the one torchvision's model predicts.
    let class_arg =
        class.map_or("predicted".to_string(), |c| CLASSES.iter().position(|k| *k == c).unwrap().to_string());
    // Each row's photo, found by its file name.
    let photo_of = |row: &csv::StringRecord| -> &PathBuf {
        images.iter().find(|p| row[0].ends_with(p.file_name().unwrap().to_str().unwrap())).unwrap()
    };
    let mut args: Vec<&std::ffi::OsStr> = vec![
        arch.name().as_ref(),
        "3".as_ref(),
        weights.as_os_str(),
        hidden.as_ref(),
        layer.as_ref(),
        // data.image_size, and the default data.eval_resize: 256/224 of it.
        "224".as_ref(),
        "256".as_ref(),
        class_arg.as_ref(),
        theirs_path.as_os_str(),
    ];
    args.extend(rows.iter().map(|row| photo_of(row).as_os_str()));
    common::run_python("gradcam_reference.py", &args);
    let theirs = read_safetensors(&theirs_path).unwrap().tensors;

    let side = 224 >> (layer.as_bytes()[5] - b'0' + 1);
    for (i, (row, map)) in rows.iter().zip(&maps).enumerate() {
        let ours = read_safetensors(map).unwrap();
        let input_diff =
            (&ours.tensors["input"] - &theirs[&format!("input_{i}")]).abs().max().double_value(&[]);
        assert!(input_diff <= 1e-6, "{}: the input differs from torchvision's by {input_diff}", &row[0]);
        let cam = &ours.tensors["cam"];
        assert_eq!(cam.size(), vec![side, side], "{arch} {layer}: map of {}", &row[0]);
        let range = (cam.max() - cam.min()).double_value(&[]);
        assert!(
            range > 1e-6 * cam.max().double_value(&[]).max(1e-30),
            "{}: a flat map tests nothing",
            &row[0]
        );
        let normalised = (cam - cam.min()) / (cam.max() - cam.min() + 1e-7);
        let diff = (&normalised - &theirs[&format!("cam_{i}")]).abs().max().double_value(&[]);
        assert!(diff <= 1e-4, "{arch} {layer}: {} map differs from pytorch-grad-cam's by {diff}", &row[0]);

        // The probabilities the index reports are torchvision's.
        let probabilities = &theirs[&format!("probabilities_{i}")];
        let explained = CLASSES.iter().position(|c| *c == &row[4]).unwrap();
        let predicted = CLASSES.iter().position(|c| *c == &row[2]).unwrap();
        assert_eq!(predicted as i64, probabilities.argmax(0, false).int64_value(&[]), "{}", &row[0]);
        let theirs_explained = probabilities.double_value(&[explained as i64]);
        assert!((row[5].parse::<f64>().unwrap() - theirs_explained).abs() < 1e-5, "{row:?}");
        if let Some(class) = class {
            assert_eq!(&row[4], class);
        } else {
            assert_eq!(explained, predicted);
        }
        let theirs_class = theirs[&format!("class_{i}")].int64_value(&[0]);
        assert_eq!(explained as i64, theirs_class, "{}: the class explained", &row[0]);

        // The overlay: the photo as the model saw it, red where the map is hottest, blue where
        // it is coldest.
        let overlay = image::open(out.join(&row[7])).unwrap().to_rgb8();
        assert_eq!(overlay.dimensions(), (224, 224));
        let scale = 224 / side;
        let at = |flat: i64| {
            let (y, x) = (flat / side, flat % side);
            *overlay.get_pixel((x * scale + scale / 2) as u32, (y * scale + scale / 2) as u32)
        };
        let (hot, cold) =
            (at(cam.argmax(None, false).int64_value(&[])), at(cam.argmin(None, false).int64_value(&[])));
        assert!(hot[0] > hot[2], "{}: hottest cell {hot:?} is not red", &row[0]);
        assert!(cold[2] > cold[0], "{}: coldest cell {cold:?} is not blue", &row[0]);
    }
}

#[test]
fn resnet18_with_the_tutorials_head_matches_pytorch_grad_cam() {
    matches_pytorch_grad_cam(Arch::Resnet18, &[512], "layer4", None);
}

#[test]
fn resnet34_with_the_tutorials_head_matches_pytorch_grad_cam_for_a_given_class() {
    matches_pytorch_grad_cam(Arch::Resnet34, &[512], "layer4", Some("C4"));
}

#[test]
fn an_earlier_stage_matches_pytorch_grad_cam() {
    matches_pytorch_grad_cam(Arch::Resnet18, &[], "layer3", Some("C0"));
}

/// A bad `--layer` or `--class` is refused naming it, as a usage error (exit 2), before any
/// file is written.
#[test]
fn a_bad_layer_or_class_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint_of(dir.path(), Arch::Resnet18, &[]);
    let images = photos(dir.path(), 1);
    for (flag, value, expected) in [
        ("--layer", "layer5", "--layer layer5: expected layer1"),
        ("--class", "C3", "--class C3: not a class"),
    ] {
        let out = dir.path().join(format!("out-{value}"));
        let output = common::rtrain(dir.path())
            .args(["explain", "--checkpoint"])
            .arg(&ckpt)
            .arg("--out")
            .arg(&out)
            .args([flag, value])
            .args(&images)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "a usage error: {stderr}");
        assert!(stderr.contains(expected), "{stderr}");
        assert!(!out.exists(), "{value}: an output directory was made");
    }
}
