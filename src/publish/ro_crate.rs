//! `ro-crate-metadata.json`: the bundle as an RO-Crate 1.1 following the Process Run Crate
//! profile (0.5) of the Workflow Run RO-Crate collection. Every file of the bundle is a `File`
//! with its sha256 and size; each training run is a `CreateAction` whose instrument is the
//! rtrain that ran it (version, git revision, binary sha256, container image and digest),
//! whose objects are its configuration and the training and validation data (described, not
//! carried: each data file by its path and sha256), and whose results are its weights,
//! metrics, evaluation and logs; the report over the runs is one more action. People and the
//! licence are the author's (`--author`, `--license`), placeholders otherwise.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{name_and_link, Bundle, BundleFile, BundledRun, CITATION, MODEL_CARD};
use crate::run_dir::manifest::{self, DataSplit, Manifest};

const RO_CRATE: &str = "https://w3id.org/ro/crate/1.1";
const CONTEXT: &str = "https://w3id.org/ro/crate/1.1/context";
/// How an action that finished is marked (a string: the profile's validator compares text).
const COMPLETED: &str = "http://schema.org/CompletedActionStatus";
const PROCESS_RUN_CRATE: &str = "https://w3id.org/ro/wfrun/process/0.5";
const SPDX: &str = "http://spdx.org/licenses/";
/// The one term used beyond RO-Crate 1.1's context: schema.org's `sha256` (which RO-Crate 1.2's
/// context defines), added as RO-Crate 1.1 says ad hoc terms are.
const SHA256_TERM: &str = "http://schema.org/sha256";

fn id(id: &str) -> Value {
    json!({ "@id": id })
}

/// One value as itself and several as an array, as RO-Crate's JSON-LD prefers.
fn one_or_many(mut values: Vec<Value>) -> Value {
    match values.len() {
        1 => values.remove(0),
        _ => Value::Array(values),
    }
}

/// An RFC 3339 time with its offset written out (`+00:00` for `Z`), the ISO 8601 form the
/// Process Run Crate profile's validator accepts.
fn with_offset(time: &str) -> String {
    match time.strip_suffix('Z') {
        Some(utc) => format!("{utc}+00:00"),
        None => time.to_string(),
    }
}

/// The identifier of an rtrain build: its source at `revision` in the repository (absolute, as
/// the profile asks), told apart from other builds of it by its binary's sha256.
fn software_id(revision: &str, binary: Option<&str>) -> String {
    let source = format!("{}/tree/{revision}", env!("CARGO_PKG_REPOSITORY"));
    match binary {
        Some(sha) => format!("{source}#sha256-{}", &sha[..sha.len().min(16)]),
        None => source,
    }
}

/// The metadata document of `bundle`.
pub fn metadata(bundle: &Bundle) -> Value {
    let mut graph = vec![
        json!({
            "@id": "ro-crate-metadata.json",
            "@type": "CreativeWork",
            "conformsTo": id(RO_CRATE),
            "about": id("./"),
        }),
        json!({
            "@id": PROCESS_RUN_CRATE,
            "@type": "CreativeWork",
            "name": "Process Run Crate",
            "version": "0.5",
        }),
    ];
    let (people, organisations) = people(bundle);
    let authors =
        one_or_many(people.iter().map(|person| id(person["@id"].as_str().unwrap_or_default())).collect());
    let license = license(bundle);

    let mut software: BTreeMap<String, Value> = BTreeMap::new();
    let mut data: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut actions = Vec::new();
    for run in &bundle.runs {
        let instrument = software_of(&run.manifest);
        let instrument_id = instrument["@id"].as_str().unwrap_or_default().to_string();
        software.entry(instrument_id.clone()).or_insert(instrument);
        let mut objects: Vec<Value> = run.file("config.toml").map(|f| id(&f.path)).into_iter().collect();
        for split in &run.manifest.data {
            let entities = data.entry(split.sha256.clone()).or_insert_with(|| data_entities(split));
            objects.push(id(entities[0]["@id"].as_str().unwrap_or_default()));
        }
        let results: Vec<Value> = run
            .files
            .iter()
            .filter(|file| !file.path.ends_with("/config.toml"))
            .map(|f| id(&f.path))
            .collect();
        actions.push(train_action(run, &instrument_id, objects, results, &authors));
    }
    let publisher = publishing_software();
    let publisher_id = publisher["@id"].as_str().unwrap_or_default().to_string();
    software.entry(publisher_id.clone()).or_insert(publisher);
    actions.push(json!({
        "@id": "#report",
        "@type": "CreateAction",
        "name": "Report over the runs, with the seed statistics",
        "description": format!("rtrain report {} --out report", bundle.runs.iter().map(|r| r.path("")).collect::<Vec<_>>().join(" ")),
        "endTime": with_offset(&manifest::now()),
        "instrument": id(&publisher_id),
        "agent": authors,
        "object": one_or_many(bundle.runs.iter().filter_map(|run| run.file("metrics.jsonl")).map(|f| id(&f.path)).collect()),
        "result": one_or_many(bundle.report_files.iter().map(|f| id(&f.path)).collect()),
        "actionStatus": COMPLETED,
    }));

    let files: Vec<&BundleFile> = bundle
        .documents
        .iter()
        .chain(bundle.runs.iter().flat_map(|run| &run.files))
        .chain(&bundle.report_files)
        .collect();
    let mut root = json!({
        "@id": "./",
        "@type": "Dataset",
        "name": bundle.title(),
        "description": description(bundle),
        "datePublished": bundle.date,
        "license": id(license["@id"].as_str().unwrap_or_default()),
        "author": authors,
        "publisher": id(organisations[1]["@id"].as_str().unwrap_or_default()),
        "conformsTo": id(PROCESS_RUN_CRATE),
        "keywords": ["image classification", "ResNet", "deep learning", "model card", "rtrain"],
        "hasPart": files.iter().map(|f| id(&f.path)).collect::<Vec<_>>(),
        "mentions": actions.iter().map(|a| id(a["@id"].as_str().unwrap_or_default())).collect::<Vec<_>>(),
    });
    if let Some(card) = bundle.documents.iter().find(|f| f.path == MODEL_CARD) {
        root["subjectOf"] = id(&card.path);
    }
    graph.push(root);
    graph.extend(files.iter().map(|file| file_entity(file)));
    graph.extend(actions);
    graph.extend(software.into_values());
    graph.extend(data.into_values().flatten());
    graph.extend(people);
    graph.extend(organisations);
    graph.push(license);
    json!({ "@context": [CONTEXT, { "sha256": SHA256_TERM }], "@graph": graph })
}

/// A file of the bundle, with what it is.
fn file_entity(file: &BundleFile) -> Value {
    let name = file.path.rsplit('/').next().unwrap_or(&file.path);
    let mut entity = json!({
        "@id": file.path,
        "@type": "File",
        "name": name,
        "contentSize": file.bytes.to_string(),
        "sha256": file.sha256,
        "encodingFormat": media_type(name),
    });
    if let Some(description) = describe(&file.path, name) {
        entity["description"] = json!(description);
    }
    entity
}

/// What a file is, by its extension: the bundle's own files, and the data's photos and
/// WebDataset shards.
fn media_type(name: &str) -> &'static str {
    let extension = name.rsplit_once('.').map(|(_, extension)| extension.to_ascii_lowercase());
    match extension.as_deref() {
        Some("md") => "text/markdown",
        Some("json") => "application/json",
        Some("jsonl") => "application/jsonl",
        Some("toml") => "application/toml",
        Some("csv") => "text/csv",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("tar") => "application/x-tar",
        Some("cff") => "application/x-yaml",
        // safetensors (a JSON header and the raw tensors), TensorBoard's event files.
        _ => "application/octet-stream",
    }
}

fn describe(path: &str, name: &str) -> Option<&'static str> {
    Some(match name {
        MODEL_CARD => {
            "Model card (Mitchell et al. 2019): what the model is for, how it was trained and evaluated"
        }
        CITATION => "How to cite the model (Citation File Format 1.2.0)",
        "model.safetensors" => "Final weights (safetensors; torchvision parameter names)",
        "best.safetensors" => {
            "Checkpoint of the epoch with the best validation top-1 (weights and training state)"
        }
        "manifest.json" => {
            "Run manifest: resolved configuration, software, hosts, seeds, data and file hashes"
        }
        "config.toml" => "The resolved training configuration",
        "metrics.jsonl" => "Per-step and per-epoch training and validation records",
        "summary.json" => "Summary of the run: epochs, best and final validation, throughput",
        "metrics.json" if path.contains("/evaluation/") => {
            "Best checkpoint on the validation split: metrics with 95% bootstrap intervals"
        }
        "predictions.csv" => "Every validation image's label, prediction and class probabilities",
        "seeds.csv" => "Seed statistics: per group and metric n, mean, sd, 95% t-interval, min, max",
        "comparisons.csv" => "Groups compared: difference of means with Welch's 95% interval and test",
        _ if name.starts_with("events.out.tfevents") => "TensorBoard event file",
        _ => return None,
    })
}

/// The rtrain that trained a run.
fn software_of(manifest: &Manifest) -> Value {
    let binary = manifest.software.rtrain_sha256.as_deref();
    let mut details = vec![format!("libtorch {}", manifest.software.libtorch)];
    if let Some(sha) = binary {
        details.push(format!("binary sha256 {sha}"));
    }
    let container = &manifest.container;
    if container.runtime != "none" {
        details.push(format!(
            "in a {} container{}{}",
            container.runtime,
            container.image.as_deref().map_or(String::new(), |image| format!(" of image {image}")),
            container.image_digest.as_deref().map_or(String::new(), |digest| format!(" (digest {digest})"))
        ));
    }
    software(&manifest.rtrain_version, &manifest.git_revision, binary, &details)
}

/// The rtrain writing the bundle (its report).
fn publishing_software() -> Value {
    let binary = crate::util::files::sha256_file(std::path::Path::new("/proc/self/exe")).ok();
    software(env!("CARGO_PKG_VERSION"), manifest::GIT_REVISION, binary.as_deref(), &[])
}

/// An rtrain build as a `SoftwareApplication`: its version, git revision and binary sha256,
/// and what else is known of how it ran (`details`, into its description).
fn software(version: &str, revision: &str, binary: Option<&str>, details: &[String]) -> Value {
    let description =
        std::iter::once(format!("rtrain {version} (git {revision})")).chain(details.iter().cloned());
    let mut entity = json!({
        "@id": software_id(revision, binary),
        "@type": "SoftwareApplication",
        "name": "rtrain",
        "url": env!("CARGO_PKG_REPOSITORY"),
        "softwareVersion": version,
        "description": description.collect::<Vec<_>>().join("; "),
        "identifier": format!("git:{revision}"),
    });
    if let Some(sha) = binary {
        entity["sha256"] = json!(sha);
    }
    entity
}

fn train_action(
    run: &BundledRun,
    instrument: &str,
    objects: Vec<Value>,
    results: Vec<Value>,
    authors: &Value,
) -> Value {
    let m = &run.manifest;
    let job = &m.job;
    let description = format!(
        "rtrain train: {} for {} epochs (batch {} per rank), seed {}, {} rank(s) on {} node(s) ({}), {}, \
         configuration sha256 {}; launched by {}",
        m.config.model.arch,
        m.epochs.len(),
        m.config.data.batch_size,
        m.seeds.run,
        job.world_size,
        job.nodes,
        job.hosts.join(", "),
        job.device,
        m.config_hash,
        job.launcher
    );
    let mut action = json!({
        "@id": format!("#train-{}", run.name),
        "@type": "CreateAction",
        "name": format!("Training run {}", run.name),
        "description": description,
        "startTime": with_offset(&m.started),
        "instrument": id(instrument),
        "agent": authors,
        "object": one_or_many(objects),
        "result": one_or_many(results),
        "actionStatus": COMPLETED,
    });
    if let Some(finished) = &m.finished {
        action["endTime"] = json!(with_offset(finished));
    }
    action
}

/// A data split as the directory training read (a `Dataset`, not in the bundle: a local
/// identifier) with the files it holds, each with its sha256 (the first entity is the split).
fn data_entities(split: &DataSplit) -> Vec<Value> {
    let key = &split.sha256[..split.sha256.len().min(16)];
    let file_id = |index: usize| format!("#data-{key}-{index}");
    let mut entities = vec![json!({
        "@id": format!("#data-{key}"),
        "@type": "Dataset",
        "name": format!("{} split: {} images of {} classes", split.split, split.images, split.classes.len()),
        "description": format!(
            "Not in this bundle: the {} files under {} that training read, each named by its path \
             there (alternateName) with its sha256. The split's sha256 is over every path and file \
             hash in order, as manifest.json records it.",
            split.files.len(),
            split.root.display()
        ),
        "alternateName": split.root.display().to_string(),
        "identifier": format!("sha256:{}", split.sha256),
        "hasPart": (0..split.files.len()).map(|i| id(&file_id(i))).collect::<Vec<_>>(),
    })];
    for (index, (path, sha256)) in split.files.iter().enumerate() {
        entities.push(json!({
            "@id": file_id(index),
            "@type": "File",
            "alternateName": path,
            "sha256": sha256,
            "encodingFormat": media_type(path),
        }));
    }
    entities
}

/// The authors (or one placeholder), and the organisations: their affiliation and the
/// publisher (each the author's, or a placeholder). One given with its URL (`NAME <URL>`: an
/// ORCID, a ROR) is identified by it.
fn people(bundle: &Bundle) -> (Vec<Value>, Vec<Value>) {
    let authorship = &bundle.authorship;
    let entity = |kind: &str, local: String, text: &str| {
        let (name, link) = name_and_link(text);
        let mut entity = json!({ "@id": link.map_or(local, str::to_string), "@type": kind, "name": name });
        if let Some(url) = link {
            entity["url"] = json!(url);
        }
        entity
    };
    let affiliation = entity(
        "Organization",
        "#affiliation".into(),
        authorship
            .affiliation
            .as_deref()
            .unwrap_or("[AUTHOR: the authors' organisation, as --affiliation 'NAME <ROR URL>']"),
    );
    let publisher = entity(
        "Organization",
        "#publisher".into(),
        authorship.publisher.as_deref().unwrap_or(
            "[AUTHOR: the archive that publishes this, e.g. --publisher 'Zenodo <https://zenodo.org>']",
        ),
    );
    let placeholder = ["[AUTHOR: your name, as --author 'NAME <ORCID URL>']".to_string()];
    let names = match authorship.authors.is_empty() {
        true => &placeholder[..],
        false => &authorship.authors[..],
    };
    let people = names
        .iter()
        .enumerate()
        .map(|(index, text)| {
            let mut person = entity("Person", format!("#author-{}", index + 1), text);
            person["affiliation"] = id(affiliation["@id"].as_str().unwrap_or_default());
            person
        })
        .collect();
    (people, vec![affiliation, publisher])
}

fn license(bundle: &Bundle) -> Value {
    match &bundle.authorship.license {
        Some(spdx) => json!({
            "@id": format!("{SPDX}{spdx}"),
            "@type": "CreativeWork",
            "name": spdx,
            "identifier": spdx,
        }),
        None => json!({
            "@id": "#license",
            "@type": "CreativeWork",
            "name": "[AUTHOR: the licence of the weights, e.g. CC-BY-4.0; make its SPDX URL this entity's @id]",
        }),
    }
}

fn description(bundle: &Bundle) -> String {
    let classes = bundle.classes().join(", ");
    format!(
        "{} trained with rtrain: the final and best weights of {} run(s), their configurations, manifests, \
         metrics, evaluations and TensorBoard logs (runs/), a report with seed statistics (report/), a model \
         card ({MODEL_CARD}) and a citation ({CITATION}). Classes, in output order: {classes}.",
        bundle.title(),
        bundle.runs.len()
    )
}
