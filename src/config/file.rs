//! The file layer: the TOML configuration file as a figment provider, with
//! errors that name the file, line and column.

use std::path::{Path, PathBuf};

use figment::value::{Dict, Map};
use figment::{Metadata, Profile, Provider, Source};

use super::ConfigError;

/// The config file layer: read and parsed by us so that a missing file is an
/// error (figment's file provider treats it as empty) and parse errors are
/// one line.
pub(super) struct FileLayer {
    pub(super) path: PathBuf,
    pub(super) dict: Dict,
}

impl FileLayer {
    pub(super) fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Unreadable {
            path: path.to_path_buf(),
            reason: io_reason(&e),
        })?;
        let dict: Dict = toml::from_str(&text).map_err(|e| {
            let position = e
                .span()
                .map(|span| {
                    let (line, column) = line_column(&text, span.start);
                    format!(" at line {line}, column {column}")
                })
                .unwrap_or_default();
            ConfigError::Syntax {
                path: path.to_path_buf(),
                position,
                message: one_line(e.message()),
            }
        })?;
        Ok(FileLayer {
            path: path.to_path_buf(),
            dict,
        })
    }
}

impl Provider for FileLayer {
    fn metadata(&self) -> Metadata {
        Metadata::from("config file", Source::File(self.path.clone()))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.dict.clone()))
    }
}

/// "No such file or directory (os error 2)" -> "No such file or directory".
fn io_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.rfind(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

pub(super) fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}
