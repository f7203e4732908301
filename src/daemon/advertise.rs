//! The address written into the records of the elections this daemon
//! leads, where followers and clients find the leader's HTTP API: the
//! configured one, the bound one, or one of this host's.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::config::Config;
use crate::lease::HolderMeta;

/// Work out the address to advertise (see [`advertised_address`]) and put it
/// into every election's holder description. Returns it, for the balancer's
/// member record.
pub(super) fn advertise_in_records(cfg: &mut Config, bound: Option<SocketAddr>) -> Option<String> {
    let advertised = advertised_address(cfg.http.advertise.as_deref(), bound);
    if let Some(address) = &advertised {
        tracing::info!(advertise = %address, "advertising this address in the records of the elections it leads");
        for e in &mut cfg.elections {
            // Not shared yet (the node is built after): no copy is made.
            Arc::make_mut(e).holder_meta = Some(HolderMeta {
                address: Some(address.clone()),
                ..Default::default()
            });
        }
    }
    advertised
}

/// The address written into the records of the elections this instance
/// leads: `http.advertise` if set; else the bound address unless it is a
/// wildcard; else the first non-loopback address of this host (IPv4 first)
/// with the bound port. `None` only when nothing at all is known.
fn advertised_address(configured: Option<&str>, bound: Option<SocketAddr>) -> Option<String> {
    if let Some(a) = configured {
        return Some(a.to_owned());
    }
    let bound = bound?;
    if !bound.ip().is_unspecified() {
        return Some(bound.to_string());
    }
    let mut found: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .map(|addrs| {
            addrs
                .filter_map(|ifa| {
                    let addr = ifa.address?;
                    if let Some(v4) = addr.as_sockaddr_in() {
                        Some(IpAddr::V4(v4.ip()))
                    } else {
                        addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
                    }
                })
                .filter(|ip| !ip.is_loopback() && !ip.is_unspecified() && !is_link_local(ip))
                .collect()
        })
        .unwrap_or_default();
    found.sort_by_key(|ip| ip.is_ipv6());
    match found.first() {
        Some(ip) => Some(SocketAddr::new(*ip, bound.port()).to_string()),
        None => {
            tracing::warn!("no non-loopback address found to advertise; set http.advertise");
            Some(SocketAddr::new(IpAddr::from([127, 0, 0, 1]), bound.port()).to_string())
        }
    }
}

/// IPv6 link-local addresses (fe80::/10) need a scope to be reached.
fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}
