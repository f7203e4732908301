//! `leaderd resign ELECTION [--to IDENTITY] [--url URL]`: ask a running
//! daemon to step down in one election, handing the lease to a named
//! candidate or to whoever is fastest. The same request as
//! `POST /leader/{election}/resign`, with the admin token from the
//! configuration (`http.admin_token`, or `LEADERD_HTTP__ADMIN_TOKEN`).
//!
//! Exit codes: 0 stepped down (or still at it when the daemon's time was
//! up, or stepped down as the daemon shut down: it says so); 77 nothing
//! changed: this daemon does not lead the election, or an earlier resign of
//! it is still under way (409 either way); 64 a usage problem (no token, a
//! token no header can carry, a wrong token, resign disabled, an unknown
//! election, a bad `--to`); 69 the daemon cannot be reached or is shutting
//! down (503); 70 anything else.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};

use super::ResignArgs;
use super::tool::ToolError;
use crate::config::ResignConfig;
use crate::http_client::{self, CONNECT_TIMEOUT};
use crate::{exit, text};

/// How long the whole request may take: the daemon answers 202 after its
/// own request timeout (10 s) if stepping down takes longer.
const REQUEST_LIMIT: Duration = Duration::from_secs(15);

/// Run `leaderd resign`; prints the daemon's answer.
pub async fn run(args: ResignArgs) -> Result<(), ToolError> {
    let cfg = ResignConfig::load(args.config.as_deref())
        .map_err(|e| ToolError::new(e.exit_code(), e.to_string()))?;
    let Some(token) = cfg.admin_token else {
        return Err(ToolError::new(
            exit::USAGE,
            "no admin token: set http.admin_token in the config file or LEADERD_HTTP__ADMIN_TOKEN (the daemon's own)",
        ));
    };
    let address = match &args.url {
        Some(url) => address_of(url)?,
        None => local_address(cfg.listen).to_string(),
    };
    let body = match &args.to {
        Some(to) => serde_json::json!({ "to": to }).to_string(),
        None => String::new(),
    };
    let path = format!("/leader/{}/resign", text::path_segment(&args.election));
    let request = Request::post(path)
        .header(HOST, &address)
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| ToolError::new(exit::USAGE, format!("cannot build the request: {e}")))?;
    let unreachable = |e: String| ToolError::new(exit::UNAVAILABLE, e);
    let answer = tokio::time::timeout(REQUEST_LIMIT, async {
        let (mut sender, conn) = http_client::connect(&address, CONNECT_TIMEOUT).await?;
        tokio::spawn(conn);
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request to {address} failed: {e}"))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the answer from {address} failed: {e}"))?
            .to_bytes();
        Ok::<_, String>((status.as_u16(), body))
    })
    .await
    .map_err(|_| {
        unreachable(format!(
            "no answer from {address} within {}",
            text::duration(REQUEST_LIMIT)
        ))
    })?
    .map_err(unreachable)?;
    let (status, body) = answer;
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let message = json["message"].as_str().map_or_else(
        || String::from_utf8_lossy(&body).trim().to_owned(),
        str::to_owned,
    );
    let code = match status {
        200 | 202 => {
            println!("{}: {message}", args.election);
            return Ok(());
        }
        409 => exit::NOT_OURS,
        400 | 401 | 403 | 404 => exit::USAGE,
        503 => exit::UNAVAILABLE,
        _ => exit::SOFTWARE,
    };
    Err(ToolError::new(
        code,
        format!("{address} answered {status}: {message}"),
    ))
}

/// The `HOST:PORT` of an `http://HOST:PORT` URL (a trailing `/` allowed).
fn address_of(url: &str) -> Result<String, ToolError> {
    let bad = |why: &str| {
        ToolError::new(
            exit::USAGE,
            format!(
                "--url {} {why} (like http://127.0.0.1:9777)",
                text::echo(url)
            ),
        )
    };
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("is not an http:// URL"))?;
    let host_port = rest.strip_suffix('/').unwrap_or(rest);
    if host_port.is_empty()
        || host_port.contains(['/', '?', '#', '@'])
        || host_port.contains(char::is_whitespace)
    {
        return Err(bad("is not http://HOST:PORT"));
    }
    if !host_port
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0))
    {
        return Err(bad("has no port"));
    }
    Ok(host_port.to_owned())
}

/// Where to reach a daemon that listens on `listen` from this host: the
/// loopback address of the same family when it listens on every address.
fn local_address(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port())
        }
        _ => listen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_listen_addresses_become_addresses_to_connect_to() {
        assert_eq!(
            address_of("http://10.0.0.1:9777/").ok().as_deref(),
            Some("10.0.0.1:9777")
        );
        assert_eq!(
            address_of("http://[::1]:9777").ok().as_deref(),
            Some("[::1]:9777")
        );
        for bad in [
            "https://a:1",
            "http://a",
            "http://a:0",
            "http://a:1/x",
            "10.0.0.1:9777",
            "http://:80",
        ] {
            assert!(address_of(bad).is_err(), "{bad}");
        }
        let local = |s: &str| local_address(s.parse().expect("an address")).to_string();
        assert_eq!(local("0.0.0.0:9777"), "127.0.0.1:9777");
        assert_eq!(local("[::]:9777"), "[::1]:9777");
        assert_eq!(local("10.1.2.3:80"), "10.1.2.3:80");
    }
}
