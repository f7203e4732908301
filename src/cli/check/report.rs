//! The report of `leaderd check`: one item per line, `ok`, `warn` or
//! `fail`, what was checked, what was found, and for a warning or a
//! failure what to do; or all of it as one JSON document (`--json`).

use serde::Serialize;
use serde_json::{Map, Value};

use crate::lease::StoreError;

/// How an item came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// As `leaderd run` needs it.
    Ok,
    /// `run` would work, but something deserves a look.
    Warn,
    /// `run` would not work (or not as configured).
    Fail,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Item {
    /// How it came out.
    pub status: Status,
    /// What was checked: `timing`, `store`, `dynamodb:PutItem`, `clock`…
    pub item: String,
    /// What was found, in one line.
    pub detail: String,
    /// What to do about a warning or a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// The figures behind the line, for machines (durations in ms).
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub values: Map<String, Value>,
}

impl Item {
    /// This item with the figure `key` = `value`.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Item {
        self.values.insert(key.to_owned(), value.into());
        self
    }

    /// This item with what to do.
    pub fn fix(mut self, fix: impl Into<String>) -> Item {
        self.fix = Some(fix.into());
        self
    }
}

/// An item that came out `status`.
pub fn item(status: Status, item: impl Into<String>, detail: impl Into<String>) -> Item {
    Item {
        status,
        item: item.into(),
        detail: detail.into(),
        fix: None,
        values: Map::new(),
    }
}

/// An `ok` item.
pub fn ok(name: impl Into<String>, detail: impl Into<String>) -> Item {
    item(Status::Ok, name, detail)
}

/// A `warn` item.
pub fn warn(name: impl Into<String>, detail: impl Into<String>) -> Item {
    item(Status::Warn, name, detail)
}

/// A `fail` item.
pub fn fail(name: impl Into<String>, detail: impl Into<String>) -> Item {
    item(Status::Fail, name, detail)
}

/// A `fail` item for a store error: what went wrong, and what to do about
/// that kind of error. A call the IAM policy denies is named by its action,
/// whatever `name` says (a step may make several calls).
pub fn store_failure(name: impl Into<String>, e: &StoreError) -> Item {
    let (detail, fix) = match e {
        StoreError::Denied {
            action,
            table,
            detail,
        } => (
            format!("not allowed to call {action} on table `{table}` ({detail})"),
            format!(
                "add {action} to the IAM policy of leaderd's credentials (see config/iam/README.md)"
            ),
        ),
        StoreError::Transport(_) | StoreError::Timeout(_) => (
            e.to_string(),
            "check store.endpoint_url (--endpoint-url), the region, and that this host reaches the store (DNS, routes, firewalls, proxies)".to_owned(),
        ),
        StoreError::Credentials(_) => (
            e.to_string(),
            "give leaderd valid AWS credentials (environment, AWS profile, IRSA web identity, ECS or instance role); an expired token or a clock far off also fails here".to_owned(),
        ),
        StoreError::TableMissing(table) => (
            format!("table `{table}` does not exist"),
            "create it with `leaderd table create` (add --ttl to have DynamoDB delete ended sessions), or set store.create_table = true".to_owned(),
        ),
        StoreError::TableNotActive { .. } => (
            e.to_string(),
            "wait until the table is ACTIVE (`leaderd table describe`)".to_owned(),
        ),
        StoreError::WrongSchema { table, detail } => (
            format!("table `{table}` has the wrong schema: {detail}"),
            "use another table (store.table) or recreate this one with `leaderd table create`"
                .to_owned(),
        ),
        StoreError::Throttled(_) | StoreError::Server(_) => (
            e.to_string(),
            "try again; if it persists, look at the table's capacity and the service's health"
                .to_owned(),
        ),
        StoreError::Unusable(_) => (
            e.to_string(),
            "do what the message says: grant the privileges it names, or point store.url at a writable primary".to_owned(),
        ),
        StoreError::Other(_) => (
            e.to_string(),
            "correct what the message names".to_owned(),
        ),
    };
    let name = match e {
        StoreError::Denied { action, .. } => (*action).to_owned(),
        _ => name.into(),
    };
    fail(name, detail).fix(fix)
}

/// Every item `leaderd check` found, in the order it checked them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    items: Vec<Item>,
}

impl Report {
    /// Add an item.
    pub fn add(&mut self, item: Item) {
        self.items.push(item);
    }

    /// The items so far.
    pub fn items(&self) -> &[Item] {
        &self.items
    }

    fn count(&self, status: Status) -> usize {
        self.items.iter().filter(|i| i.status == status).count()
    }

    /// Whether `leaderd run` would work: no item failed.
    pub fn passed(&self) -> bool {
        self.count(Status::Fail) == 0
    }

    /// The last line: how many failed, how many warn, and what that means.
    pub fn summary(&self) -> String {
        let (failed, warned) = (self.count(Status::Fail), self.count(Status::Warn));
        let warnings = match warned {
            0 => String::new(),
            1 => ", 1 warning".to_owned(),
            n => format!(", {n} warnings"),
        };
        if failed == 0 {
            format!(
                "{} items checked{warnings}: `leaderd run` would work here",
                self.items.len()
            )
        } else {
            format!(
                "{failed} of {} items failed{warnings}: `leaderd run` would not work here",
                self.items.len()
            )
        }
    }

    /// One line per item, `STATUS  ITEM: DETAIL`, then `; fix: WHAT TO DO`
    /// when there is something to do, and last `check: SUMMARY`.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for i in &self.items {
            out.push_str(&format!("{:<4}  {}: {}", i.status.word(), i.item, i.detail));
            if let Some(fix) = &i.fix {
                out.push_str("; fix: ");
                out.push_str(fix);
            }
            out.push('\n');
        }
        out.push_str(&format!("check: {}\n", self.summary()));
        out
    }

    /// The report as one JSON document: `ok` (whether `run` would work),
    /// the counts, every item and the summary.
    pub fn json(&self) -> String {
        let doc = serde_json::json!({
            "ok": self.passed(),
            "failed": self.count(Status::Fail),
            "warnings": self.count(Status::Warn),
            "summary": self.summary(),
            "items": self.items,
        });
        // A tree of strings, numbers and maps always serialises.
        format!("{doc}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_one_line_per_item_with_the_fix_and_a_summary() {
        let mut report = Report::default();
        report.add(ok("timing", "L 10s").with("lease_ms", 10_000));
        report.add(warn("clock", "1h ahead").fix("sync it"));
        assert!(report.passed());
        report.add(store_failure(
            "dynamodb:GetItem",
            &StoreError::Denied {
                action: "dynamodb:GetItem",
                table: "t".into(),
                detail: "AccessDenied".into(),
            },
        ));
        assert!(!report.passed());
        let text = report.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[0], "ok    timing: L 10s");
        assert_eq!(lines[1], "warn  clock: 1h ahead; fix: sync it");
        assert!(
            lines[2].starts_with("fail  dynamodb:GetItem: not allowed to call dynamodb:GetItem")
                && lines[2].ends_with(
                    "fix: add dynamodb:GetItem to the IAM policy of leaderd's credentials (see config/iam/README.md)"
                ),
            "{}",
            lines[2]
        );
        assert_eq!(
            lines[3],
            "check: 1 of 3 items failed, 1 warning: `leaderd run` would not work here"
        );
    }

    #[test]
    fn json_has_the_verdict_the_counts_and_every_item() {
        let mut report = Report::default();
        report.add(ok("timing", "L 10s").with("lease_ms", 10_000));
        report.add(fail("store", "gone").fix("create it"));
        let doc: Value = serde_json::from_str(&report.json()).expect("JSON");
        assert_eq!(doc["ok"], false);
        assert_eq!(doc["failed"], 1);
        assert_eq!(doc["warnings"], 0);
        assert_eq!(doc["items"][0]["status"], "ok");
        assert_eq!(doc["items"][0]["values"]["lease_ms"], 10_000);
        assert!(doc["items"][0].get("fix").is_none());
        assert_eq!(doc["items"][1]["status"], "fail");
        assert_eq!(doc["items"][1]["fix"], "create it");
        assert!(doc["items"][1].get("values").is_none());
    }
}
