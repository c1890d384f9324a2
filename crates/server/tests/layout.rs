//! Every crate's modules import one another in one direction only: no top-level module of a
//! crate's `src` reaches, through `crate::` paths, back to itself. (docs/architecture.md,
//! "Modules and their order", lists the server's order.)

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

/// The `crate::NAME` paths a source text names, outside comments: `crate::a::b` and each
/// first name inside `crate::{a, b::c, …}`.
fn named(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut names = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(inner) = rest.strip_prefix('{') {
            // The group's items at its first level.
            let (mut depth, mut start) = (1, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 1 && c == ',' || depth == 0 {
                    let item = inner[start..i].trim_start_matches([',', ' ', '\n', '\t']);
                    let name: String = item
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        names.insert(name);
                    }
                    start = i + 1;
                }
                if depth == 0 {
                    break;
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

fn sources(path: &Path, out: &mut Vec<String>) {
    if path.is_dir() {
        for entry in fs::read_dir(path).unwrap() {
            sources(&entry.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(fs::read_to_string(path).unwrap());
    }
}

/// The cycle among `src`'s top-level modules, if there is one (as `a -> b -> a`).
fn cycle_in(src: &Path) -> Option<String> {
    let mut modules = BTreeMap::new();
    for entry in fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" || name == "main" {
            continue;
        }
        let mut texts = Vec::new();
        sources(&path, &mut texts);
        modules.insert(name, texts);
    }
    let uses: BTreeMap<&str, BTreeSet<String>> = modules
        .iter()
        .map(|(name, texts)| {
            let mut to: BTreeSet<String> = texts.iter().flat_map(|t| named(t)).collect();
            to.retain(|m| m != name && modules.contains_key(m));
            (name.as_str(), to)
        })
        .collect();
    // A path back to `from` through what it imports, if there is one.
    fn back_to<'a>(
        from: &'a str,
        at: &'a str,
        uses: &'a BTreeMap<&str, BTreeSet<String>>,
        seen: &mut BTreeSet<&'a str>,
        path: &mut Vec<&'a str>,
    ) -> bool {
        for next in &uses[at] {
            if next == from {
                path.push(next);
                return true;
            }
            if seen.insert(next) {
                path.push(next);
                if back_to(from, next, uses, seen, path) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    uses.keys().find_map(|&module| {
        let mut path = vec![module];
        back_to(module, module, &uses, &mut BTreeSet::new(), &mut path).then(|| path.join(" -> "))
    })
}

#[test]
fn no_module_of_any_crate_imports_its_way_back_to_itself() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for entry in fs::read_dir(&crates).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        checked += 1;
        if let Some(cycle) = cycle_in(&src) {
            panic!(
                "an import cycle in {}: {cycle} (see docs/architecture.md, \"Modules and their order\")",
                src.display()
            );
        }
    }
    assert!(checked >= 7, "found {checked} crates");
}

#[test]
fn reads_both_kinds_of_path() {
    let names =
        named("use crate::{a::b, c, d::{e, f}};\n// crate::comment\nlet x = crate::g::h();");
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["a", "c", "d", "g"]);
}

/// The binary chooses the broker (issue #31): the server knows the broker contract
/// (`herald-broker`) and its embedded stores, and no remote engine's crate, so that adding
/// one (Sentinel, Cluster, NATS) touches the binary and the engine's crate only.
#[test]
fn the_server_depends_on_no_remote_broker() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("the server's manifest");
    let dependencies = manifest
        .split("\n[")
        .find(|section| section.starts_with("dependencies]"))
        .expect("a [dependencies] section");
    let remote: Vec<&str> = dependencies
        .lines()
        .filter(|line| line.starts_with("herald-broker-"))
        .collect();
    assert!(remote.is_empty(), "the server depends on {remote:?}");
    let sources = {
        let mut all = Vec::new();
        sources(
            Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")),
            &mut all,
        );
        all
    };
    assert!(!sources.is_empty());
    for text in sources {
        for remote in ["herald_broker_redis", "herald_broker_nats"] {
            assert!(!text.contains(remote), "a source names {remote}:\n{text}");
        }
    }
}

/// Nor does the server's configuration name an engine (issue #31): `storage`, `[redis]`
/// and `[nats]` are the binary's to read, beside the code that builds the engine.
#[test]
fn the_server_configuration_names_no_engine() {
    let mut config = Vec::new();
    sources(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src/config")),
        &mut config,
    );
    assert!(!config.is_empty());
    for text in config {
        for engine in [
            "pub redis:",
            "pub nats:",
            "pub storage:",
            "RedisConfig",
            "NatsConfig",
            "StorageEngine",
        ] {
            assert!(
                !text.contains(engine),
                "the server's configuration holds {engine}"
            );
        }
    }
}

/// Issue #58: the hub and the queues carry publications for every protocol and know none;
/// what a front makes of a publication lives in the front, in a slot it registers
/// (`fronts::slots`). No protocol of a front is named in `hub/` or `queue/`, comments
/// included.
#[test]
fn the_hub_and_the_queues_name_no_protocol_of_a_front() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for dir in ["hub", "queue"] {
        let mut texts = Vec::new();
        sources(&src.join(dir), &mut texts);
        assert!(!texts.is_empty(), "src/{dir} has sources");
        for text in texts {
            let lower = text.to_lowercase();
            for protocol in ["pusher", "phoenix", "centrifugo", "socket.io"] {
                assert!(!lower.contains(protocol), "src/{dir} names {protocol}");
            }
        }
    }
}
