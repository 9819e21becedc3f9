//! Who is on the other end of a connection: the peer a limit counts (an IPv4 address, or
//! the /64 an IPv6 address is in — one host's share of addresses), the proxies trusted to
//! say who their client is (`--trusted-proxy CIDR`), and the client a request comes from
//! (the nearest address in a trusted proxy's `Forwarded` or `X-Forwarded-For` that is not
//! itself a trusted proxy; the TCP peer otherwise).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use axum::http::HeaderMap;

/// The peer a limit counts: an IPv4 address, or an IPv6 /64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PeerKey(IpAddr);

impl PeerKey {
    pub(crate) fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => PeerKey(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => PeerKey(IpAddr::V4(v4)),
                None => {
                    let bits = u128::from(v6) & !((1u128 << 64) - 1);
                    PeerKey(IpAddr::V6(Ipv6Addr::from(bits)))
                }
            },
        }
    }
}

impl fmt::Display for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// The client a request came from, as the connection layer found it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Client {
    pub(crate) key: PeerKey,
}

/// A block of addresses: `10.0.0.0/8`, `2001:db8::/32`, or one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (addr, bits) = match text.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (text, None),
        };
        let net: IpAddr = addr.trim().parse().map_err(|_| {
            format!("{text:?} is not an address block: write it as 10.0.0.0/8, 2001:db8::/32 or one address")
        })?;
        let most = if net.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => most,
            Some(b) => b.trim().parse::<u8>().ok().filter(|b| *b <= most).ok_or_else(|| {
                format!("{text:?}: the prefix length must be a number from 0 through {most}")
            })?,
        };
        Ok(Cidr { net, bits })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.bits)
    }
}

impl Cidr {
    /// Whether `ip` is in this block (an IPv4-mapped IPv6 address counts as its IPv4 one).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.bits)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Whether `ip` is a proxy trusted to name its client.
pub(crate) fn trusted(ip: IpAddr, proxies: &[Cidr]) -> bool {
    proxies.iter().any(|c| c.contains(ip))
}

/// The client of a request that came from `peer`: `peer` itself unless it is a trusted
/// proxy; then the nearest hop its `Forwarded` (else `X-Forwarded-For`) names that is not
/// a trusted proxy. A hop that is not an address (`unknown`, an obfuscated name) stops the
/// walk at the proxy that named it: nobody trusted vouches for what is behind it.
pub(crate) fn client(peer: IpAddr, headers: &HeaderMap, proxies: &[Cidr]) -> IpAddr {
    if !trusted(peer, proxies) {
        return peer;
    }
    let hops: Vec<Option<IpAddr>> = if headers.contains_key("forwarded") {
        headers
            .get_all("forwarded")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(forwarded_for)
            .collect()
    } else {
        headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|hop| address(hop.trim()))
            .collect()
    };
    let mut nearest = peer;
    for hop in hops.into_iter().rev() {
        match hop {
            Some(ip) if trusted(ip, proxies) => nearest = ip,
            Some(ip) => return ip,
            None => return nearest,
        }
    }
    nearest
}

/// The `for=` of one element of a `Forwarded` header (RFC 7239).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        k.trim().eq_ignore_ascii_case("for").then(|| address(v.trim().trim_matches('"')))?
    })
}

/// An address as a forwarding header writes it: `192.0.2.1`, `192.0.2.1:4711`,
/// `[2001:db8::1]`, `[2001:db8::1]:4711` or `2001:db8::1`.
fn address(text: &str) -> Option<IpAddr> {
    if let Some(rest) = text.strip_prefix('[') {
        return rest.split_once(']').and_then(|(a, _)| a.parse::<Ipv6Addr>().ok()).map(IpAddr::V6);
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    let (host, port) = text.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn an_ipv6_peer_counts_per_64_and_a_mapped_ipv4_one_as_itself() {
        assert_eq!(PeerKey::of(ip("2001:db8:1:2:aaaa::1")), PeerKey::of(ip("2001:db8:1:2::ffff")));
        assert_ne!(PeerKey::of(ip("2001:db8:1:2::1")), PeerKey::of(ip("2001:db8:1:3::1")));
        assert_eq!(PeerKey::of(ip("::ffff:10.1.2.3")), PeerKey::of(ip("10.1.2.3")));
        assert_eq!(PeerKey::of(ip("2001:db8:1:2::7")).to_string(), "2001:db8:1:2::/64");
    }

    #[test]
    fn blocks_parse_and_contain() {
        let block: Cidr = "10.0.0.0/8".parse().expect("a block");
        assert!(block.contains(ip("10.200.1.1")) && !block.contains(ip("11.0.0.1")));
        assert!(block.contains(ip("::ffff:10.0.0.9")));
        let one: Cidr = "192.0.2.7".parse().expect("a block");
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let v6: Cidr = "2001:db8::/32".parse().expect("a block");
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("10.0.0.1")));
        assert!("0.0.0.0/0".parse::<Cidr>().expect("a block").contains(ip("8.8.8.8")));
        for bad in ["10.0.0.0/33", "banana", "10.0.0.0/x", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_trusted_proxy_names_the_nearest_untrusted_hop_and_nobody_else_does() {
        let proxies: Vec<Cidr> = vec!["10.0.0.0/8".parse().expect("a block")];
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            "203.0.113.9, 198.51.100.4, 10.0.0.3".parse().expect("a header value"),
        );
        // The spoofable leftmost hop is not believed: the nearest untrusted one is.
        assert_eq!(client(ip("10.0.0.2"), &headers, &proxies), ip("198.51.100.4"));
        // A peer that is no trusted proxy is the client, whatever it says.
        assert_eq!(client(ip("198.51.100.1"), &headers, &proxies), ip("198.51.100.1"));
        let mut forwarded = HeaderMap::new();
        forwarded.insert(
            "forwarded",
            "for=192.0.2.60;proto=http, for=\"[2001:db8::1]:4711\"".parse().expect("a block"),
        );
        assert_eq!(client(ip("10.0.0.2"), &forwarded, &proxies), ip("2001:db8::1"));
        let mut unknown = HeaderMap::new();
        unknown.insert("forwarded", "for=unknown".parse().expect("a header value"));
        assert_eq!(client(ip("10.0.0.2"), &unknown, &proxies), ip("10.0.0.2"));
        assert_eq!(client(ip("10.0.0.2"), &HeaderMap::new(), &proxies), ip("10.0.0.2"));
    }
}
