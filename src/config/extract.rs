//! Merging the file and environment layers, and turning figment's errors
//! into one line that names the key, the value and where it was set.

use std::collections::BTreeMap;
use std::path::Path;

use figment::error::{Actual, Kind};
use figment::value::{Dict, Value};
use figment::{Figment, Profile, Source};

use super::ConfigError;
use super::env::{ENV_SOURCE, EnvLayer};
use super::file::{FileLayer, one_line};
use super::raw::RawConfig;
use crate::text::{echo, echo_plain};

/// Defaults (serde) < file < environment, extracted into the raw layer.
pub(super) fn extract(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<RawConfig, ConfigError> {
    let mut figment = Figment::new();
    let mut sources = BTreeMap::new();
    if let Some(path) = file {
        let layer = FileLayer::read(path)?;
        let origin = path.display().to_string();
        file_keys(&layer.dict, "", &mut |key| {
            sources.insert(key, origin.clone());
        });
        figment = figment.merge(layer);
    }
    let env = EnvLayer::new(env)?;
    let warnings = env.warnings();
    let names: Vec<(String, Vec<String>)> = env
        .vars
        .iter()
        .map(|(name, path, _)| (name.clone(), path.clone()))
        .collect();
    // Later wins, as the layers merge.
    for (name, path) in &names {
        sources.insert(path.join("."), name.clone());
    }
    figment = figment.merge(env);
    let mut raw = figment
        .extract_lossy::<RawConfig>()
        .map_err(|e| figment_error(e, &names))?;
    raw.warnings = warnings;
    raw.sources = sources;
    Ok(raw)
}

/// Every key the file sets a value of (`lease.duration`), `prefix` first;
/// an array is one key.
fn file_keys(dict: &Dict, prefix: &str, found: &mut impl FnMut(String)) {
    for (name, value) in dict {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        match value {
            Value::Dict(_, inner) => file_keys(inner, &key, found),
            _ => found(key),
        }
    }
}

/// Turn figment's (possibly multi-error, multi-line) error into one line
/// about the first problem.
fn figment_error(error: figment::Error, env: &[(String, Vec<String>)]) -> ConfigError {
    let key = echo_plain(&key_path(&error.path));
    let origin = error.metadata.as_ref().map(|md| match &md.source {
        Some(Source::File(path)) => path.display().to_string(),
        _ if md.name == ENV_SOURCE => {
            // The variable itself, not the key path figment stopped at (an
            // unknown section stops at its first segment).
            let name = env
                .iter()
                .find(|(_, path)| path.starts_with(&error.path))
                .map_or_else(
                    || md.interpolate(&Profile::Default, &error.path),
                    |(name, _)| name.clone(),
                );
            format!("environment variable {}", echo_plain(&name))
        }
        _ => md.name.to_string(),
    });
    let at = origin
        .as_ref()
        .map(|o| format!(", in {o}"))
        .unwrap_or_default();
    let message = match &error.kind {
        Kind::UnknownField(_, known) => {
            return ConfigError::UnknownKey {
                key,
                origin: origin.unwrap_or_else(|| "the configuration".into()),
                known: known.join(", "),
            };
        }
        Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
            format!(
                "{key} = {} is not {}{at}",
                show(actual),
                plain_expected(expected)
            )
        }
        Kind::UnknownVariant(value, known) => format!(
            "{key} = {value:?} is not one of {}{at}",
            known
                .iter()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Kind::MissingField(field) => {
            let key = if key.is_empty() {
                field.to_string()
            } else {
                format!("{key}.{field}")
            };
            return ConfigError::invalid(key.clone(), format!("{key} is missing{at}"));
        }
        other => format!("{key}: {}{at}", one_line(&other.to_string())),
    };
    ConfigError::invalid(key, message)
}

/// ["elections", "0", "duration"] -> "elections[0].duration".
fn key_path(path: &[String]) -> String {
    let mut out = String::new();
    for segment in path {
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{segment}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(segment);
        }
    }
    out
}

/// serde's names for what it wanted, in TOML words.
fn plain_expected(expected: &str) -> String {
    if expected.starts_with("struct ") || expected == "a map" {
        "a table".to_string()
    } else if expected == "a sequence" {
        "an array".to_string()
    } else if expected == "a boolean" {
        "a boolean (true or false)".to_string()
    } else {
        expected.to_string()
    }
}

/// A value as the user wrote it.
fn show(actual: &Actual) -> String {
    match actual {
        Actual::Str(s) => echo(s),
        Actual::Bool(b) => b.to_string(),
        Actual::Unsigned(n) => n.to_string(),
        Actual::Signed(n) => n.to_string(),
        Actual::Float(n) => n.to_string(),
        Actual::Char(c) => format!("{:?}", c.to_string()),
        Actual::Seq => "an array".into(),
        Actual::Map => "a table".into(),
        other => other.to_string(),
    }
}
