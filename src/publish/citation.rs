//! `CITATION.cff`: how to cite the trained model, in the Citation File Format 1.2.0 that
//! GitHub, Zenodo and DesignSafe read, referencing the rtrain that trained it. Strings are
//! written as JSON strings, which YAML reads as its double-quoted scalars.

use std::fmt::Write as _;

use super::{name_and_link, Bundle};

/// A YAML double-quoted scalar holding `text`.
fn quoted(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

/// The citation of `bundle`'s model.
pub fn write(bundle: &Bundle) -> String {
    let mut cff = String::from(
        "# How to cite this model: the Citation File Format 1.2.0 (citation-file-format.github.io).\n\
         # Written by `rtrain publish`; entries marked [AUTHOR] are yours to fill in (then run\n\
         # `rtrain publish --seal` on this directory). Add the DOI the archive gives under `doi:`.\n",
    );
    cff.push_str("cff-version: 1.2.0\n");
    cff.push_str("message: \"If you use this model, please cite it as below.\"\n");
    // CFF knows software and datasets; trained weights are data a program made.
    cff.push_str("type: dataset\n");
    let _ = writeln!(cff, "title: {}", quoted(&bundle.title()));
    cff.push_str("authors:\n");
    if bundle.authorship.authors.is_empty() {
        cff.push_str(
            "  - name: \"[AUTHOR] a person is family-names, given-names and orcid instead of name\"\n",
        );
    }
    for author in &bundle.authorship.authors {
        let (author, link) = name_and_link(author);
        match author.rsplit_once(' ') {
            Some((given, family)) => {
                let _ =
                    writeln!(cff, "  - given-names: {}\n    family-names: {}", quoted(given), quoted(family));
            }
            None => {
                let _ = writeln!(cff, "  - name: {}", quoted(author));
            }
        }
        if let Some(affiliation) = &bundle.authorship.affiliation {
            let _ = writeln!(cff, "    affiliation: {}", quoted(name_and_link(affiliation).0));
        }
        if let Some(orcid) = link.filter(|url| url.starts_with("https://orcid.org/")) {
            let _ = writeln!(cff, "    orcid: {}", quoted(orcid));
        }
    }
    let _ = writeln!(cff, "date-released: {}", quoted(&bundle.date));
    if let Some(license) = &bundle.authorship.license {
        let _ = writeln!(cff, "license: {}", quoted(license));
    }
    let classes = bundle.classes().join(", ");
    let abstract_text = format!(
        "Weights of {} run(s) of {} trained with rtrain to classify photos into: {classes}. With the model \
         card, configurations, manifests, metrics and evaluations.",
        bundle.runs.len(),
        bundle.runs[0].manifest.config.model.arch
    );
    let _ = writeln!(cff, "abstract: {}", quoted(&abstract_text));
    cff.push_str("keywords:\n  - image classification\n  - ResNet\n  - deep learning\n");
    let trained_by = &bundle.runs[0].manifest;
    cff.push_str("references:\n  - type: software\n    title: rtrain\n");
    cff.push_str("    authors:\n      - name: \"The rtrain developers\"\n");
    let _ = writeln!(cff, "    version: {}", quoted(&trained_by.rtrain_version));
    let _ = writeln!(cff, "    repository-code: {}", quoted(env!("CARGO_PKG_REPOSITORY")));
    let commit = trained_by.git_revision.trim_end_matches("-dirty");
    if commit != "unknown" {
        let _ = writeln!(cff, "    commit: {}", quoted(commit));
    }
    cff
}
