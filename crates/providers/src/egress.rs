//! The egress guard: the one check every URL Baton calls on a user's behalf goes through
//! (webhooks, HTTP tools, MCP servers over HTTP and model providers).
//!
//! A URL passes when its scheme is `http` or `https`, its host is on the allow-list (when
//! there is one), and every address it stands for is public: loopback, private, link-local
//! (the cloud metadata address 169.254.169.254 among them), carrier-grade NAT, multicast,
//! unspecified, reserved and benchmarking ranges — and the IPv6 forms that carry such an
//! IPv4 address (mapped, compatible, NAT64, 6to4) — are refused unless the policy allows
//! private addresses. The client [`EgressPolicy::client`] builds resolves each name once per
//! connection through the guard (within [`RESOLVE_TIMEOUT`], at most [`ADDRESSES_MAX`]
//! addresses) and connects to exactly the addresses it checked (a name that changes its
//! answer between a check and the connection cannot slip through), checks every redirect
//! again, follows at most [`REDIRECTS_MAX`], and ignores proxy settings of
//! the environment, which would connect elsewhere than what was checked.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use serde::Deserialize;

/// The most redirects one request follows.
pub const REDIRECTS_MAX: usize = 5;

/// The longest a name may take to resolve.
pub const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The most addresses of one name that are checked and tried.
pub const ADDRESSES_MAX: usize = 16;

/// Where outbound requests may go (`[egress]` in baton.toml).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressPolicy {
    /// Hosts a URL may name: exact names, or `*.example.com` for its subdomains. Empty:
    /// any host whose addresses are public.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// Whether loopback, private and link-local addresses may be called (a receiver on
    /// the same machine or network). Off by default.
    #[serde(default)]
    pub allow_private: bool,
}

impl EgressPolicy {
    /// Why `url` may not be called, if it may not, before any address is looked up: its
    /// scheme, its host against the allow-list, and an address written in the URL.
    pub fn check_url(&self, url: &Url) -> Result<(), String> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "{url}: only http and https URLs are called, not `{}`",
                url.scheme()
            ));
        }
        let Some(host) = url.host_str() else {
            return Err(format!("{url}: the URL names no host"));
        };
        if !self.host_allowed(host) {
            return Err(format!(
                "{url}: host `{host}` is not in the egress allow-list ({})",
                self.allow_hosts.join(", ")
            ));
        }
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = literal.parse::<IpAddr>() {
            self.check_addr(ip).map_err(|why| format!("{url}: {why}"))?;
        }
        Ok(())
    }

    /// Why the address may not be connected to, if it may not.
    pub fn check_addr(&self, ip: IpAddr) -> Result<(), String> {
        match forbidden(ip) {
            Some(range) if !self.allow_private || range == METADATA => Err(format!(
                "address {ip} is {range}, which is refused{}",
                if range == METADATA {
                    ""
                } else {
                    " (allow it with `allow_private = true` under [egress] in baton.toml)"
                }
            )),
            _ => Ok(()),
        }
    }

    /// The policy a model provider configured at `url` is called under: this one, with
    /// loopback and private addresses allowed when the URL itself is on one — an address
    /// written in it, or `localhost` — since the operator wrote where the server is. A
    /// name is still resolved through the guard (a public name that answers with a private
    /// address is refused), a redirect is still checked, and the metadata address is never
    /// called.
    pub fn for_configured(&self, url: &Url) -> EgressPolicy {
        let host = url.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
        let local = host.eq_ignore_ascii_case("localhost")
            || host.to_ascii_lowercase().ends_with(".localhost")
            || host
                .parse::<IpAddr>()
                .is_ok_and(|ip| forbidden(ip).is_some_and(|range| range != METADATA));
        EgressPolicy { allow_private: self.allow_private || local, ..self.clone() }
    }

    fn host_allowed(&self, host: &str) -> bool {
        self.allow_hosts.is_empty() || self.allow_hosts.iter().any(|p| host_matches(p, host))
    }

    /// `builder` made to call only what this policy allows: names resolved through the
    /// guard, every redirect checked, no proxy. Each request's URL is still to be checked
    /// with [`EgressPolicy::check_url`] before it is sent (an address written in the URL is
    /// not looked up).
    pub fn client(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        let policy = Arc::new(self.clone());
        let redirects = Arc::clone(&policy);
        builder.no_proxy().dns_resolver(GuardedResolver { policy }).redirect(
            reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= REDIRECTS_MAX {
                    let error = format!("more than {REDIRECTS_MAX} redirects");
                    return attempt.error(error);
                }
                match redirects.check_url(attempt.url()) {
                    Ok(()) => attempt.follow(),
                    Err(why) => attempt.error(format!("a redirect was refused: {why}")),
                }
            }),
        )
    }
}

/// Whether `host` is named by `pattern`: the host itself, or `*.example.com` for any of
/// its subdomains (case and a trailing dot aside).
pub fn host_matches(pattern: &str, host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let pattern = pattern.trim_end_matches('.').to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(suffix) => {
            host.len() > suffix.len() + 1
                && host.ends_with(suffix)
                && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
        }
        None => host == pattern,
    }
}

/// What the metadata address is called in refusals; never allowed.
const METADATA: &str = "the cloud metadata address";

/// Resolves a name once and hands the connector exactly the addresses it checked; a name
/// with any refused address is refused whole (one of them would otherwise be tried).
struct GuardedResolver {
    policy: Arc<EgressPolicy>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = Arc::clone(&self.policy);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let lookup = tokio::net::lookup_host((host.as_str(), 0));
            let found: Vec<SocketAddr> = tokio::time::timeout(RESOLVE_TIMEOUT, lookup)
                .await
                .map_err(|_| format!("`{host}` did not resolve within {RESOLVE_TIMEOUT:?}"))?
                .map_err(|e| format!("cannot resolve `{host}`: {e}"))?
                .take(ADDRESSES_MAX)
                .collect();
            if found.is_empty() {
                return Err(format!("`{host}` resolves to no address").into());
            }
            for addr in &found {
                policy.check_addr(addr.ip()).map_err(|why| format!("`{host}`: {why}"))?;
            }
            Ok(Box::new(found.into_iter()) as Addrs)
        })
    }
}

/// The refused range an address falls in, if any.
pub fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        _ if ip == Ipv4Addr::new(169, 254, 169, 254) => METADATA,
        (0, ..) => "in 0.0.0.0/8 (this network)",
        (127, ..) => "loopback",
        (10, ..) => "private (10.0.0.0/8)",
        (172, 16..=31, _) => "private (172.16.0.0/12)",
        (192, 168, _) => "private (192.168.0.0/16)",
        (169, 254, _) => "link-local",
        (100, 64..=127, _) => "carrier-grade NAT (100.64.0.0/10)",
        (192, 0, 0) => "IETF protocol assignments (192.0.0.0/24)",
        (198, 18 | 19, _) => "for benchmarking (198.18.0.0/15)",
        (224..=239, ..) => "multicast",
        (240..=255, ..) => "reserved (240.0.0.0/4, broadcast)",
        _ => return None,
    })
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let segments = ip.segments();
    // IPv6 forms that carry an IPv4 address are judged by it: mapped (::ffff:a.b.c.d),
    // compatible (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d) and 6to4 (2002:AABB:CCDD::).
    let embedded = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    if let Some(v4) = ip.to_ipv4_mapped() {
        return forbidden_v4(v4);
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if let [0, 0, 0, 0, 0, 0, hi, lo] | [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] | [0x2002, hi, lo, ..] =
        segments
    {
        return forbidden_v4(embedded(hi, lo));
    }
    Some(match segments[0] {
        s if s & 0xfe00 == 0xfc00 => "unique local (fc00::/7)",
        s if s & 0xffc0 == 0xfe80 => "link-local (fe80::/10)",
        s if s & 0xffc0 == 0xfec0 => "site-local (fec0::/10)",
        s if s & 0xff00 == 0xff00 => "multicast",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(ip: &str) -> bool {
        forbidden(ip.parse().expect("an address")).is_some()
    }

    #[test]
    fn private_loopback_link_local_and_their_ipv6_forms_are_refused() {
        for ip in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.0.7",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "198.18.0.1",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::10.0.0.1",
            "64:ff9b::192.168.0.1",
            "2002:c0a8:0101::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
        ] {
            assert!(refused(ip), "{ip} should be refused");
        }
        for ip in [
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "1.1.1.1",
            "2606:4700::1111",
            "64:ff9b::8.8.8.8",
        ] {
            assert!(!refused(ip), "{ip} is public");
        }
    }

    #[test]
    fn the_metadata_address_is_refused_even_where_private_addresses_are_allowed() {
        let open = EgressPolicy { allow_private: true, ..EgressPolicy::default() };
        assert!(open.check_addr("10.0.0.1".parse().expect("ip")).is_ok());
        let url = Url::parse("http://169.254.169.254/latest/meta-data/").expect("url");
        let why = open.check_url(&url).expect_err("refused");
        assert!(why.contains("the cloud metadata address"), "{why}");
        let mapped = Url::parse("http://[::ffff:169.254.169.254]/").expect("url");
        assert!(open.check_url(&mapped).is_err());
    }

    #[test]
    fn hosts_outside_the_allow_list_and_other_schemes_are_refused() {
        let policy = EgressPolicy {
            allow_hosts: vec!["hooks.example.com".to_owned(), "*.corp.example".to_owned()],
            allow_private: false,
        };
        let check = |u: &str| policy.check_url(&Url::parse(u).expect("url"));
        assert!(check("https://hooks.example.com/x").is_ok());
        assert!(check("https://HOOKS.example.com./x").is_ok());
        assert!(check("https://a.corp.example/x").is_ok());
        assert!(check("https://corp.example/x").is_err());
        assert!(check("https://evilcorp.example/x").is_err());
        assert!(check("https://example.com/x").is_err());
        assert!(check("file:///etc/passwd").expect_err("refused").contains("only http and https"));
        assert!(check("ftp://hooks.example.com/").is_err());
    }

    #[test]
    fn the_policy_reads_from_its_table_and_refuses_unknown_keys() {
        let policy: EgressPolicy =
            toml::from_str("allow_hosts = [\"hooks.example.com\"]\nallow_private = true\n")
                .expect("policy");
        assert_eq!(policy.allow_hosts, ["hooks.example.com"]);
        assert!(policy.allow_private);
        assert!(toml::from_str::<EgressPolicy>("allow_host = []\n").is_err());
    }
}
