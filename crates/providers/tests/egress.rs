//! The egress guard against a real HTTP server on 127.0.0.1: a name that resolves to the
//! loopback address is refused before any connection, allowed only where the policy says
//! so, and a redirect is checked again.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};

use baton_providers::egress::EgressPolicy;

static CRYPTO: Once = Once::new();

/// A server on 127.0.0.1 that answers `/` with a redirect to `redirect` (when given) and
/// every other path with `ok`; how many requests it got.
fn server(redirect: Option<String>) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            counted.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]).to_string();
            let response = match (&redirect, request.starts_with("GET / ")) {
                (Some(to), true) => format!(
                    "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                ),
                _ => {
                    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".to_owned()
                }
            };
            let _ = stream.write_all(response.as_bytes());
        }
    });
    (port, hits)
}

async fn get(policy: &EgressPolicy, url: &str) -> Result<String, String> {
    CRYPTO.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    let url = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
    policy.check_url(&url)?;
    let client = policy.client(reqwest::Client::builder()).build().map_err(|e| e.to_string())?;
    let response = client.get(url).send().await.map_err(|e| format!("{e:?}"))?;
    response.text().await.map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_name_that_resolves_to_loopback_is_refused_unless_private_addresses_are_allowed() {
    let (port, hits) = server(None);
    let url = format!("http://localhost:{port}/hook");
    let why = get(&EgressPolicy::default(), &url).await.expect_err("refused");
    assert!(why.contains("loopback") && why.contains("is refused"), "{why}");
    // An address written in the URL is refused before anything is sent.
    let why = get(&EgressPolicy::default(), &format!("http://127.0.0.1:{port}/hook"))
        .await
        .expect_err("refused");
    assert!(why.contains("loopback"), "{why}");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "no connection was made");
    let open = EgressPolicy { allow_private: true, ..EgressPolicy::default() };
    assert_eq!(get(&open, &url).await.expect("allowed"), "ok");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn every_redirect_is_checked_again() {
    // The allowed host redirects to an address outside the allow-list: refused, and the
    // second request is never sent.
    let (target, target_hits) = server(None);
    let (port, hits) = server(Some(format!("http://127.0.0.1:{target}/elsewhere")));
    let policy = EgressPolicy { allow_hosts: vec!["localhost".to_owned()], allow_private: true };
    let why = get(&policy, &format!("http://localhost:{port}/")).await.expect_err("refused");
    assert!(why.contains("a redirect was refused") && why.contains("allow-list"), "{why}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(target_hits.load(Ordering::SeqCst), 0);
    // A redirect within the allow-list is followed.
    let (port, _) = server(Some(format!("http://localhost:{target}/elsewhere")));
    assert_eq!(get(&policy, &format!("http://localhost:{port}/")).await.expect("followed"), "ok");
    assert_eq!(target_hits.load(Ordering::SeqCst), 1);
}
