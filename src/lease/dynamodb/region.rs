//! The AWS region of the lease table when `--region` (`store.region`) does
//! not name one: the standard AWS sources, in the order the AWS CLI and SDKs
//! use.
//!
//! 1. `AWS_REGION`, then `AWS_DEFAULT_REGION` (an empty value counts as
//!    unset: a chart that renders `AWS_REGION=""` must not hide the next
//!    source);
//! 2. `region` in the selected AWS profile (`AWS_PROFILE`, else `default`) of
//!    the AWS config file (`AWS_CONFIG_FILE`, else `~/.aws/config`) or the
//!    shared credentials file, following `source_profile`: aws-config's
//!    profile region provider;
//! 3. the EC2 instance metadata (IMDSv2), unless `AWS_EC2_METADATA_DISABLED`
//!    is `true`: one attempt, bounded by [`IMDS_TIMEOUT`].
//!
//! Why the instance metadata stays, but bounded: on EC2 it answers in a
//! millisecond and is how an instance with no configuration knows its
//! region, as the AWS SDKs do. It is asked only when nothing above names a
//! region, so a configured region never waits for it. Off EC2 nothing answers
//! at 169.254.169.254 and the SDK's own chain would wait up to 5 s (four
//! attempts with back-off) before the start fails anyway; one attempt of at
//! most 1 s turns that into a prompt, clear error. Kubernetes with IRSA and
//! ECS set `AWS_REGION` themselves.
//!
//! Nothing found is an error naming every source looked at, never a guessed
//! region: a lease table in the wrong region is an empty table, and two
//! instances in two regions would each lead.

use std::fmt;
use std::time::Duration;

use super::errors::describe;
use super::https_client;
use crate::text;
use aws_config::imds;
use aws_config::meta::region::ProvideRegion;
use aws_config::profile::ProfileFileRegionProvider;
use aws_config::provider_config::ProviderConfig;

/// The longest the instance metadata may take to name the region (token and
/// answer): it answers within milliseconds where it exists.
pub const IMDS_TIMEOUT: Duration = Duration::from_secs(1);

/// The instance metadata's region document.
const IMDS_REGION_PATH: &str = "/latest/meta-data/placement/region";

/// Where a region came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionSource {
    /// `--region`, `store.region` or `LEADERD_STORE__REGION`.
    Config,
    /// This environment variable (`AWS_REGION` or `AWS_DEFAULT_REGION`).
    Environment(&'static str),
    /// The AWS profile of this name.
    Profile(String),
    /// The EC2 instance metadata.
    InstanceMetadata,
}

impl fmt::Display for RegionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionSource::Config => f.write_str("--region (store.region)"),
            RegionSource::Environment(var) => f.write_str(var),
            RegionSource::Profile(name) => write!(f, "AWS profile {}", text::echo(name)),
            RegionSource::InstanceMetadata => f.write_str("EC2 instance metadata"),
        }
    }
}

/// What the instance metadata said when nothing else named a region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImdsOutcome {
    /// Not asked: `AWS_EC2_METADATA_DISABLED=true`.
    Disabled,
    /// No answer within [`IMDS_TIMEOUT`].
    TimedOut,
    /// It failed (not on EC2, IMDSv2 refused...), or named no region.
    Failed(String),
}

/// No source names a region: what was looked at, for one clear line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoRegion {
    /// The profile looked in (`AWS_PROFILE`, else `default`).
    pub profile: String,
    /// The AWS config file looked in (`AWS_CONFIG_FILE`, else `~/.aws/config`).
    pub config_file: String,
    /// What the instance metadata said.
    pub imds: ImdsOutcome,
}

impl fmt::Display for NoRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no AWS region: set --region (store.region), or AWS_REGION, or `region` in the AWS profile {} \
             (AWS_PROFILE) of {} (AWS_CONFIG_FILE); none of them names one, and the EC2 instance metadata ",
            text::echo(&self.profile),
            text::echo(&self.config_file),
        )?;
        match &self.imds {
            ImdsOutcome::Disabled => f.write_str("was not asked (AWS_EC2_METADATA_DISABLED=true)"),
            ImdsOutcome::TimedOut => {
                write!(f, "did not answer within {}", text::duration(IMDS_TIMEOUT))
            }
            ImdsOutcome::Failed(why) => write!(f, "did not name one ({})", text::shorten(why, 160)),
        }
    }
}

impl std::error::Error for NoRegion {}

/// The region: `configured` (`--region`, `store.region`) if given, else the
/// first of the standard AWS sources (see the module documentation) that
/// names one.
pub async fn resolve(configured: Option<&str>) -> Result<(String, RegionSource), NoRegion> {
    if let Some(region) = non_empty(configured) {
        return Ok((region, RegionSource::Config));
    }
    for var in ["AWS_REGION", "AWS_DEFAULT_REGION"] {
        if let Some(region) = non_empty(std::env::var(var).ok().as_deref()) {
            return Ok((region, RegionSource::Environment(var)));
        }
    }
    let profile = env_or("AWS_PROFILE", "default");
    // The real environment and files; the HTTP client is for the instance
    // metadata only (this build has no default one).
    let provider_config = ProviderConfig::default().with_http_client(https_client());
    let from_profile = ProfileFileRegionProvider::builder()
        .configure(&provider_config)
        .build()
        .region()
        .await;
    if let Some(region) = non_empty(from_profile.as_ref().map(|r| r.as_ref())) {
        return Ok((region, RegionSource::Profile(profile)));
    }
    let imds = match from_instance_metadata(&provider_config).await {
        Ok(region) => return Ok((region, RegionSource::InstanceMetadata)),
        Err(outcome) => outcome,
    };
    Err(NoRegion {
        profile,
        config_file: env_or("AWS_CONFIG_FILE", "~/.aws/config"),
        imds,
    })
}

/// The region the EC2 instance metadata names: one attempt, at most
/// [`IMDS_TIMEOUT`]. The endpoint may be moved with
/// `AWS_EC2_METADATA_SERVICE_ENDPOINT`, as for the SDK's own requests.
async fn from_instance_metadata(provider_config: &ProviderConfig) -> Result<String, ImdsOutcome> {
    let disabled = std::env::var("AWS_EC2_METADATA_DISABLED")
        .is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if disabled {
        return Err(ImdsOutcome::Disabled);
    }
    // The client's own limits are looser than the bound below, so that a
    // silent endpoint always reads as "did not answer".
    let client = imds::Client::builder()
        .configure(provider_config)
        .max_attempts(1)
        .connect_timeout(2 * IMDS_TIMEOUT)
        .read_timeout(2 * IMDS_TIMEOUT)
        .operation_timeout(2 * IMDS_TIMEOUT)
        .build();
    match tokio::time::timeout(IMDS_TIMEOUT, client.get(IMDS_REGION_PATH)).await {
        Err(_) => Err(ImdsOutcome::TimedOut),
        Ok(Err(e)) => Err(ImdsOutcome::Failed(describe(&e))),
        Ok(Ok(answer)) => non_empty(Some(answer.as_ref()))
            .ok_or_else(|| ImdsOutcome::Failed("an empty answer".to_owned())),
    }
}

fn non_empty(s: Option<&str>) -> Option<String> {
    s.map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

fn env_or(var: &str, default: &str) -> String {
    non_empty(std::env::var(var).ok().as_deref()).unwrap_or_else(|| default.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_configured_region_is_used_as_given() {
        // Returns before any variable, file or endpoint is looked at.
        assert_eq!(
            resolve(Some(" eu-west-3 ")).await,
            Ok(("eu-west-3".to_owned(), RegionSource::Config))
        );
    }

    #[test]
    fn no_region_names_every_source_looked_at() {
        let mut err = NoRegion {
            profile: "other".into(),
            config_file: "/etc/aws/config".into(),
            imds: ImdsOutcome::Disabled,
        };
        let text = err.to_string();
        for needle in [
            "no AWS region",
            "--region (store.region)",
            "AWS_REGION",
            r#"profile "other" (AWS_PROFILE)"#,
            r#""/etc/aws/config" (AWS_CONFIG_FILE)"#,
            "was not asked (AWS_EC2_METADATA_DISABLED=true)",
        ] {
            assert!(text.contains(needle), "`{needle}` missing from: {text}");
        }
        err.imds = ImdsOutcome::TimedOut;
        assert!(err.to_string().ends_with("did not answer within 1s"));
        err.imds = ImdsOutcome::Failed("x".repeat(500));
        let text = err.to_string();
        assert!(text.ends_with("…)") && !text.contains('\n'), "{text}");
    }

    #[test]
    fn sources_read_as_in_the_log() {
        assert_eq!(RegionSource::Config.to_string(), "--region (store.region)");
        assert_eq!(
            RegionSource::Environment("AWS_REGION").to_string(),
            "AWS_REGION"
        );
        assert_eq!(
            RegionSource::Profile("default".into()).to_string(),
            r#"AWS profile "default""#
        );
    }
}
