//! The environment layer: which `LEADERD_*` variables are settings, which
//! are ignored (the job's own variables, Kubernetes service links), and the
//! figment provider that reads them.

use figment::value::{Dict, Map, Value};
use figment::{Metadata, Profile, Provider};

use super::{ConfigError, ENV_PREFIX, TEST_ENV_PREFIX, TOP_LEVEL_KEYS};
use crate::text::{echo, echo_plain};

// ---------------------------------------------------------------------------
// Layers.

/// The process's `LEADERD_*` variables. Non-Unicode names are skipped (they
/// cannot be config keys); a non-Unicode value of a config variable is an error.
pub(super) fn process_env() -> Result<Vec<(String, String)>, ConfigError> {
    let mut vars = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(ENV_PREFIX) {
            continue;
        }
        match value.into_string() {
            Ok(value) => vars.push((name.to_string(), value)),
            Err(_) if env_role(name) != EnvRole::Config => {}
            Err(_) => {
                return Err(ConfigError::invalid(
                    env_key(name),
                    format!("environment variable {} is not valid UTF-8", echo(name)),
                ));
            }
        }
    }
    Ok(vars)
}

/// What a `LEADERD_*` variable is to the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EnvRole {
    /// A setting: `LEADERD_IDENTITY`, `LEADERD_STORE__KIND`, and anything
    /// shaped `SECTION__KEY` (a misspelt one is an error).
    Config,
    /// Not ours to read, silently: what leaderd gives its child, the
    /// service links Kubernetes adds for a Service named `leaderd…`, test
    /// hooks.
    Foreign,
    /// Neither a setting nor anything known: ignored with a warning (it may
    /// be a misspelt `LEADERD_IDENTITY`).
    Unknown,
}

fn env_role(name: &str) -> EnvRole {
    let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
        return EnvRole::Foreign;
    };
    if name.starts_with(TEST_ENV_PREFIX) {
        return EnvRole::Foreign;
    }
    let first = rest.split("__").next().unwrap_or("").to_ascii_lowercase();
    if rest.contains("__") || TOP_LEVEL_KEYS.contains(&first.as_str()) {
        return EnvRole::Config;
    }
    if crate::supervisor::child_env::ALL.contains(&name) || is_service_link(rest) {
        return EnvRole::Foreign;
    }
    // `LEADERD_STORE_KIND`: a setting with one underscore too few, which
    // must not pass silently.
    let first_word = rest.split('_').next().unwrap_or("").to_ascii_lowercase();
    if TOP_LEVEL_KEYS.contains(&first_word.as_str()) {
        EnvRole::Config
    } else {
        EnvRole::Unknown
    }
}

/// Kubernetes' service-link variables, after the `LEADERD_` of a Service
/// named `leaderd` or `leaderd-…`: `SERVICE_HOST`, `SERVICE_PORT[_NAME]`,
/// `PORT`, `PORT_9777_TCP[_ADDR|_PORT|_PROTO]`, with the rest of the
/// Service's name in front (`METRICS_PORT`).
fn is_service_link(rest: &str) -> bool {
    let words: Vec<&str> = rest.split('_').collect();
    words.windows(2).any(|w| {
        (w[0] == "SERVICE" && (w[1] == "HOST" || w[1] == "PORT"))
            || (w[0] == "PORT" && w[1].bytes().all(|b| b.is_ascii_digit()) && !w[1].is_empty())
    }) || words.last() == Some(&"PORT")
}

/// `LEADERD_STORE__KIND` -> `store.kind`.
fn env_key(name: &str) -> String {
    name.strip_prefix(ENV_PREFIX)
        .unwrap_or(name)
        .to_ascii_lowercase()
        .replace("__", ".")
}

pub(super) const ENV_SOURCE: &str = "environment";

/// The environment layer, built from an explicit list so that tests need not
/// touch the process environment.
pub(super) struct EnvLayer {
    /// (variable name, key path, value), sorted by name.
    pub(super) vars: Vec<(String, Vec<String>, String)>,
    /// `LEADERD_*` variables that are neither settings nor known: the
    /// caller warns about them.
    pub(super) unknown: Vec<String>,
}

impl EnvLayer {
    pub(super) fn new(
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut vars = Vec::new();
        let mut unknown = Vec::new();
        for (name, value) in env {
            let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            match env_role(&name) {
                EnvRole::Config => {}
                EnvRole::Foreign => continue,
                EnvRole::Unknown => {
                    unknown.push(name);
                    continue;
                }
            }
            let path: Vec<String> = rest.split("__").map(|s| s.to_ascii_lowercase()).collect();
            if path.iter().any(String::is_empty) {
                return Err(ConfigError::UnknownKey {
                    key: echo_plain(&env_key(&name)),
                    origin: format!("environment variable {}", echo_plain(&name)),
                    known: TOP_LEVEL_KEYS.join(", "),
                });
            }
            vars.push((name, path, value));
        }
        unknown.sort();
        vars.sort();
        // A variable naming a section and one naming a key inside it cannot
        // both be honoured.
        for (i, (a, pa, _)) in vars.iter().enumerate() {
            for (b, pb, _) in &vars[i + 1..] {
                let nested = (pa.len() < pb.len() && pb.starts_with(pa))
                    || (pb.len() < pa.len() && pa.starts_with(pb));
                if nested {
                    return Err(ConfigError::invalid(
                        env_key(a),
                        format!(
                            "environment variables {a} ({}) and {b} ({}) conflict: one names a section, the other a key inside it",
                            env_key(a),
                            env_key(b)
                        ),
                    ));
                }
            }
        }
        Ok(EnvLayer { vars, unknown })
    }

    /// One warning per unknown variable.
    pub(super) fn warnings(&self) -> Vec<String> {
        self.unknown
            .iter()
            .map(|name| {
                format!(
                    "environment variable {} is not a setting and is ignored (settings are LEADERD_IDENTITY and LEADERD_<SECTION>__<KEY>, like LEADERD_STORE__KIND)",
                    echo_plain(name)
                )
            })
            .collect()
    }
}

impl Provider for EnvLayer {
    fn metadata(&self) -> Metadata {
        Metadata::named(ENV_SOURCE).interpolater(|_: &Profile, keys: &[&str]| {
            format!("{ENV_PREFIX}{}", keys.join("__").to_ascii_uppercase())
        })
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut root = Dict::new();
        for (_, path, value) in &self.vars {
            // Values stay strings (so `LEADERD_IDENTITY=1234` is an identity,
            // not a number); extract_lossy turns "true"/"0.02" into bools and
            // numbers where the key wants one. A value in brackets is an
            // array, e.g. LEADERD_CHILD__COMMAND='["./job.sh", "--all"]'.
            let leaf = if value.trim_start().starts_with('[') {
                value
                    .parse::<Value>()
                    .expect("figment's Value::from_str is infallible")
            } else {
                Value::from(value.clone())
            };
            insert(&mut root, path, leaf);
        }
        Ok(Profile::Default.collect(root))
    }
}

pub(super) fn insert(dict: &mut Dict, path: &[String], leaf: Value) {
    match path {
        [] => {}
        [last] => {
            dict.insert(last.clone(), leaf);
        }
        [first, rest @ ..] => {
            let entry = dict
                .entry(first.clone())
                .or_insert_with(|| Value::from(Dict::new()));
            if let Value::Dict(_, inner) = entry {
                insert(inner, rest, leaf);
            }
            // A non-dict here is ruled out by EnvLayer::new's conflict check.
        }
    }
}
