//! `rtrain data extract` on zip archives made by Python's zipfile
//! (tests/reference/make_zips.py): a good one extracts to exactly the tree zipfile wrote, and
//! each hostile one is refused, naming the archive and the entry, with nothing written.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sha2::{Digest, Sha256};

fn zips(dir: &Path) -> std::path::PathBuf {
    let out = dir.join("zips");
    common::run_python("make_zips.py", &[out.as_os_str()]);
    out
}

/// Every path under `root` with what it is: "dir", "link -> TARGET", or "file SHA256 [x]".
fn tree(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                out.insert(name, format!("link -> {}", std::fs::read_link(&path).unwrap().display()));
            } else if meta.is_dir() {
                out.insert(name, "dir".to_string());
                walk(root, &path, out);
            } else {
                let digest = hex::encode(Sha256::digest(std::fs::read(&path).unwrap()));
                let executable = meta.permissions().mode() & 0o111 != 0;
                out.insert(name, format!("file {digest}{}", if executable { " x" } else { "" }));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

#[test]
fn a_zip_from_a_data_portal_extracts_to_the_tree_zipfile_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let zips = zips(dir.path());
    let dest = dir.path().join("Dataset");
    common::rtrain(dir.path())
        .args(["data", "extract"])
        .arg(zips.join("good.zip"))
        .arg(&dest)
        .assert()
        .success();

    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(zips.join("expected.json")).unwrap()).unwrap();
    let expected: BTreeMap<String, String> = expected
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, what)| {
            let shown = match what["kind"].as_str().unwrap() {
                "dir" => "dir".to_string(),
                "link" => format!("link -> {}", what["target"].as_str().unwrap()),
                _ => format!(
                    "file {}{}",
                    what["sha256"].as_str().unwrap(),
                    if what["executable"].as_bool().unwrap() { " x" } else { "" }
                ),
            };
            (name.clone(), shown)
        })
        .collect();
    let mut found = tree(&dest);
    // zipfile lists only the directories it was given; the others are implied by the names.
    found.retain(|name, what| what != "dir" || expected.contains_key(name));
    assert_eq!(found, expected);
}

#[test]
fn hostile_zips_are_refused_naming_the_entry_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let zips = zips(dir.path());
    let cases: [(&str, &[&str], &str); 11] = [
        ("dotdot.zip", &[], "\"../evil.txt\": it has a `..` component"),
        ("absolute.zip", &[], "\"/tmp/rtrain-evil.txt\": it is an absolute path"),
        (
            "link-out.zip",
            &[],
            "\"a/link\": symbolic link to \"../../outside\" points outside the destination",
        ),
        ("through-link.zip", &[], "\"here/evil.txt\": its parent \"here\" is a symbolic link"),
        ("device.zip", &[], "\"dev/null\": it is a device file"),
        ("fifo.zip", &[], "\"pipe\": it is a device file, FIFO or socket"),
        ("encrypted.zip", &[], "\"secret.jpg\": it is encrypted (password-protected)"),
        ("bomb.zip", &[], "\"zeros.bin\": it would unpack 67108864 bytes from"),
        ("overlap.zip", &[], "\"b.jpg\": its data overlap those of entry \"a.jpg\""),
        ("many.zip", &["--max-entries", "3"], "more than 3 entries"),
        ("truncated.zip", &[], "cannot read it as a zip archive (corrupt or truncated)"),
    ];
    for (archive, options, said) in cases {
        let scratch = dir.path().join(format!("scratch-{archive}"));
        std::fs::create_dir(&scratch).unwrap();
        let dest = scratch.join("inner/dest");
        let output = common::rtrain(dir.path())
            .args(["data", "extract"])
            .arg(zips.join(archive))
            .arg(&dest)
            .args(options)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{archive}: {stderr}");
        assert!(
            stderr.contains(archive) && stderr.contains(said),
            "{archive}: expected {said:?} in\n{stderr}"
        );
        // No destination, no staging directory left beside it, nothing above it.
        let left: Vec<_> = walk_all(&scratch);
        assert!(left.iter().all(|p| p.ends_with("inner")), "{archive}: left behind {left:?}");
    }
    assert!(!Path::new("/tmp/rtrain-evil.txt").exists());
}

fn walk_all(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        out.push(path.to_string_lossy().into_owned());
        if path.is_dir() && !path.is_symlink() {
            out.extend(walk_all(&path));
        }
    }
    out
}
