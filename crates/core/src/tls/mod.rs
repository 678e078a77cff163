//! TLS 1.3 on the TCP connections between hosts (rustls on ring: no system OpenSSL), turned on
//! by one setting:
//!
//! - certificate files: `RUSTDIST_TLS_CERT`, `RUSTDIST_TLS_KEY` and `RUSTDIST_TLS_CA` (a file
//!   or a directory), or gloo's names for them; both ends of every connection verify the
//!   other's chain against the CA (mutual TLS; names are not checked, ranks dial addresses);
//! - or pinned keys (`RUSTDIST_TLS=1` with `RUSTDIST_AUTH_KEY`, no files): each process makes
//!   a key pair and self-signed certificate at start, publishes its hash with its address
//!   (signed with the auth key), and a peer accepts exactly the certificate published for
//!   the rank it links to.
//!
//! The parts: `files` (certificates from files, the pinned identity and hashes), `verify` (the
//! certificate verifiers), `stream` (a non-blocking TLS connection over a socket). This file
//! reads the settings, builds rustls's configurations, and says what a rank publishes and
//! how the ranks' published settings must agree.

use std::fmt::Write as _;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::auth::AuthKey;
use crate::error::{Error, Result};

mod files;
mod stream;
mod verify;

#[cfg(test)]
pub(crate) use files::write_test_pki;
pub use files::{fingerprint, Fingerprint};
pub use stream::{describe_io, TlsStream};

/// The setting that turns TLS on or off (`1` / `0`; unset: on when certificate files are
/// named).
pub const TLS_ENV: &str = "RUSTDIST_TLS";
/// `1`: links between ranks on one host (TCP over loopback) are encrypted too.
pub const TLS_LOCAL_ENV: &str = "RUSTDIST_TLS_LOCAL";
/// Each file's variable, rustdist's name first and then gloo's (a gloo TLS deployment moves
/// over unchanged).
const CERT_VARS: [&str; 2] = ["RUSTDIST_TLS_CERT", "GLOO_DEVICE_TRANSPORT_TCP_TLS_CERT"];
const KEY_VARS: [&str; 2] = ["RUSTDIST_TLS_KEY", "GLOO_DEVICE_TRANSPORT_TCP_TLS_PKEY"];
const CA_VARS: [&str; 3] = [
    "RUSTDIST_TLS_CA",
    "GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_FILE",
    "GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_PATH",
];
/// The label the auth key signs a published certificate hash under.
const PIN_LABEL: &[u8] = b"rustdist tls pin v1";

/// How peers are verified.
#[derive(Clone)]
enum Trust {
    /// Chains against these roots (certificate files).
    Ca(Arc<RootCertStore>),
    /// Exactly the certificate each peer published (pinned keys).
    Pinned,
}

/// This process's TLS settings: its identity, how it trusts peers, and the crypto.
#[derive(Clone)]
pub struct Tls {
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    trust: Trust,
    /// TLS on loopback links too (`RUSTDIST_TLS_LOCAL=1`).
    pub local: bool,
    provider: Arc<CryptoProvider>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = if self.pinned() {
            "pinned keys"
        } else {
            "certificate files"
        };
        write!(f, "Tls({mode}, local: {})", self.local)
    }
}

/// The first of `vars` that is set and not empty: its name and value.
fn first_set(vars: &[&'static str]) -> Option<(&'static str, String)> {
    vars.iter().find_map(|&v| {
        std::env::var(v)
            .ok()
            .filter(|s| !s.is_empty())
            .map(|s| (v, s))
    })
}

/// A `0`/`1` setting (unset or empty: None).
fn flag(var: &str) -> Result<Option<bool>> {
    match std::env::var(var).as_deref() {
        Err(_) | Ok("") => Ok(None),
        Ok("0") => Ok(Some(false)),
        Ok("1") => Ok(Some(true)),
        Ok(other) => Err(Error::invalid(format!("{var}={other:?}: expected 0 or 1"))),
    }
}

/// ring's suites, TLS 1.3 only, AES-128-GCM first where the CPU has AES instructions (the
/// fastest there), else ChaCha20-Poly1305.
fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::{cipher_suite, default_provider};
    let aes = cpu_has_aes();
    let mut suites = vec![
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    if !aes {
        suites.rotate_right(1);
    }
    Arc::new(CryptoProvider {
        cipher_suites: suites,
        ..default_provider()
    })
}

fn cpu_has_aes() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("aes")
        && std::arch::is_x86_feature_detected!("pclmulqdq");
    #[cfg(target_arch = "aarch64")]
    return std::arch::is_aarch64_feature_detected!("aes");
    #[allow(unreachable_code)]
    false
}

impl Tls {
    /// The settings in the environment; None when TLS is off. Certificate files (any of
    /// rustdist's or gloo's names) turn it on unless `RUSTDIST_TLS=0`; `RUSTDIST_TLS=1`
    /// without them pins keys, which needs `key` (`RUSTDIST_AUTH_KEY`).
    pub fn from_env(key: Option<&AuthKey>) -> Result<Option<Tls>> {
        let on = flag(TLS_ENV)?;
        let local = flag(TLS_LOCAL_ENV)?.unwrap_or(false);
        let (cert, pkey, ca) = (
            first_set(&CERT_VARS),
            first_set(&KEY_VARS),
            first_set(&CA_VARS),
        );
        let named = cert.is_some() || pkey.is_some() || ca.is_some();
        match (on, named) {
            (Some(false), _) | (None, false) => Ok(None),
            (_, true) => {
                let missing = |vars: &[&str]| {
                    Error::invalid(format!(
                        "TLS with certificate files needs {} (else unset the other \
                         RUSTDIST_TLS_* variables, or set RUSTDIST_TLS=1 alone to pin keys \
                         through the store)",
                        vars.join(" or ")
                    ))
                };
                let (cert_var, cert) = cert.ok_or_else(|| missing(&CERT_VARS))?;
                let (key_var, pkey) = pkey.ok_or_else(|| missing(&KEY_VARS))?;
                let (ca_var, ca) = ca.ok_or_else(|| missing(&CA_VARS))?;
                Tls::with_files([(cert_var, &cert), (key_var, &pkey), (ca_var, &ca)], local)
                    .map(Some)
            }
            (Some(true), false) => {
                if key.is_none() {
                    return Err(Error::invalid(
                        "RUSTDIST_TLS=1 without certificate files pins each rank's key \
                         through the store, which needs RUSTDIST_AUTH_KEY (the same secret on \
                         every rank); set it, or name certificate files (RUSTDIST_TLS_CERT, \
                         RUSTDIST_TLS_KEY, RUSTDIST_TLS_CA)",
                    ));
                }
                Tls::with_pinned_key(local).map(Some)
            }
        }
    }

    /// Certificate files: `[(variable, path)]` of the chain, the key and the CA.
    pub fn with_files(files: [(&str, &str); 3], local: bool) -> Result<Tls> {
        let [(cert_var, cert), (key_var, key), (ca_var, ca)] = files;
        let tls = Tls {
            chain: files::chain(cert_var, cert)?,
            key: Arc::new(files::private_key(key_var, key)?),
            trust: Trust::Ca(Arc::new(files::roots(ca_var, ca)?)),
            local,
            provider: provider(),
        };
        // A key that is not the certificate's is found here, before init, so that every rank
        // can say so (`agree`), not at the first handshake, where only this one could.
        tls.server_config(None)?;
        Ok(tls)
    }

    /// Pinned keys, with this process's own key pair.
    pub fn with_pinned_key(local: bool) -> Result<Tls> {
        let id = files::pinned_identity()?;
        Ok(Tls {
            chain: vec![id.cert.clone()],
            key: id.key.clone(),
            trust: Trust::Pinned,
            local,
            provider: provider(),
        })
    }

    /// What this rank publishes with its address under store key `entry`: the mode, and
    /// with pinned keys its certificate's hash signed by `key`. Every rank must publish the
    /// same mode ([`agree`]).
    pub fn token(&self, key: Option<&AuthKey>, entry: &str) -> String {
        let local = if self.local { "+local" } else { "" };
        match (&self.trust, key) {
            (Trust::Ca(_), _) => format!("tls=ca{local}"),
            (Trust::Pinned, Some(key)) => {
                let pin = fingerprint(&self.chain[0]);
                let tag = key.tag(PIN_LABEL, &[entry.as_bytes(), &pin]);
                format!("tls=pin{local}:{}:{}", hex(&pin), hex(&tag))
            }
            // `from_env` refuses pinned keys without an auth key.
            (Trust::Pinned, None) => format!("tls=pin{local}"),
        }
    }

    /// The client side's configuration: it presents this identity and accepts the server's
    /// certificate if it is `pin` (pinned keys; None: any, for a connection whose auth-key
    /// exchange binds the TLS session instead), or chains to the CA.
    pub fn client_config(&self, pin: Option<Fingerprint>) -> Result<Arc<ClientConfig>> {
        let versions = &[&rustls::version::TLS13];
        let builder = ClientConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(versions)
            .map_err(config_error)?;
        let builder = match &self.trust {
            Trust::Ca(roots) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verify::CaServer::new(
                    roots.clone(),
                    self.provider.clone(),
                )?)),
            Trust::Pinned => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verify::Pinned::new(
                    pin,
                    self.provider.clone(),
                ))),
        };
        let mut config = builder
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(config_error)?;
        config.resumption = rustls::client::Resumption::disabled();
        config.enable_sni = false;
        Ok(Arc::new(config))
    }

    /// The server side's configuration: it presents this identity and requires the client's
    /// certificate, checked as in [`Tls::client_config`] (`pin` None with pinned keys: no
    /// client certificate is asked for).
    pub fn server_config(&self, pin: Option<Fingerprint>) -> Result<Arc<ServerConfig>> {
        let versions = &[&rustls::version::TLS13];
        let builder = ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(versions)
            .map_err(config_error)?;
        let builder = match (&self.trust, pin) {
            (Trust::Ca(roots), _) => builder.with_client_cert_verifier(
                rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.clone(),
                    self.provider.clone(),
                )
                .build()
                .map_err(|e| Error::invalid(format!("TLS: the CA cannot verify clients: {e}")))?,
            ),
            (Trust::Pinned, Some(pin)) => builder.with_client_cert_verifier(Arc::new(
                verify::Pinned::new(Some(pin), self.provider.clone()),
            )),
            (Trust::Pinned, None) => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(config_error)?;
        // One ticket: the client's sign that its certificate was taken (`TlsStream`).
        config.send_tls13_tickets = 1;
        Ok(Arc::new(config))
    }

    /// Whether peers are pinned (their certificates' hashes come from the store).
    pub fn pinned(&self) -> bool {
        matches!(self.trust, Trust::Pinned)
    }
}

fn config_error(e: rustls::Error) -> Error {
    match e {
        rustls::Error::InconsistentKeys(_) => Error::invalid(
            "TLS: the private key (RUSTDIST_TLS_KEY) does not match the certificate \
             (RUSTDIST_TLS_CERT)",
        ),
        e => Error::invalid(format!("TLS: {e}")),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    text.as_bytes()
        .chunks(2)
        .map(|pair| {
            let digits = std::str::from_utf8(pair).ok().filter(|d| d.len() == 2)?;
            u8::from_str_radix(digits, 16).ok()
        })
        .collect()
}

/// What a published token says: its mode (`off`, `ca`, `pin`, with `+local`), and a pinned
/// rank's hash and tag.
/// What a rank publishes in place of its settings when it cannot use them (a key that does not
/// match its certificate, a file it cannot read): `why`, so that every rank can say it.
pub fn broken_token(why: &Error) -> String {
    format!("tls=broken:{}", hex(why.to_string().as_bytes()))
}

fn parse_token(token: &str) -> (&str, Option<(&str, &str)>) {
    let mode = token.strip_prefix("tls=").unwrap_or("off");
    match mode.split_once(':') {
        Some((mode, rest)) => (mode, rest.split_once(':')),
        None => (mode, None),
    }
}

/// Checks that every rank published the same TLS mode as this one (`tokens[r]` is rank r's,
/// `"tls=off"` or empty for none; `entry(r)` its store key) and returns, with pinned keys,
/// every peer's certificate hash, checked against `key`. The error lists the ranks by mode,
/// the same on every rank.
pub fn agree(
    tokens: &[String],
    rank: usize,
    key: Option<&AuthKey>,
    entry: &dyn Fn(usize) -> String,
) -> Result<Vec<Option<Fingerprint>>> {
    let broken: Vec<String> = tokens
        .iter()
        .enumerate()
        .filter_map(|(r, t)| {
            let why = t.strip_prefix("tls=broken:")?;
            let why = unhex(why).and_then(|b| String::from_utf8(b).ok());
            Some(format!(
                "rank {r} cannot use its TLS settings: {}",
                why.as_deref().unwrap_or("(its reason is garbled)")
            ))
        })
        .collect();
    if !broken.is_empty() {
        return Err(Error::network(broken.join("; ")));
    }
    let modes: Vec<&str> = tokens.iter().map(|t| parse_token(t).0).collect();
    if modes.iter().any(|m| *m != modes[rank]) {
        let mut by_mode: Vec<(&str, Vec<usize>)> = Vec::new();
        for (r, m) in modes.iter().enumerate() {
            match by_mode.iter_mut().find(|(x, _)| x == m) {
                Some((_, ranks)) => ranks.push(r),
                None => by_mode.push((m, vec![r])),
            }
        }
        let parts: Vec<String> = by_mode
            .iter()
            .map(|(m, ranks)| format!("ranks {ranks:?} have {}", describe_mode(m)))
            .collect();
        return Err(Error::network(format!(
            "TLS settings disagree between ranks: {} (set RUSTDIST_TLS, RUSTDIST_TLS_CERT/KEY/CA \
             and RUSTDIST_TLS_LOCAL alike on every rank)",
            parts.join(", ")
        )));
    }
    if !modes[rank].starts_with("pin") {
        return Ok(vec![None; tokens.len()]);
    }
    let key = key.ok_or_else(|| Error::invalid("pinned TLS keys need RUSTDIST_AUTH_KEY"))?;
    (0..tokens.len())
        .map(|r| {
            let (_, pinned) = parse_token(&tokens[r]);
            let checked = pinned.and_then(|(pin, tag)| {
                let (pin, tag) = (unhex(pin)?, unhex(tag)?);
                key.verify(PIN_LABEL, &[entry(r).as_bytes(), &pin], &tag)
                    .then(|| pin.try_into().ok())
                    .flatten()
            });
            checked.map(Some).ok_or_else(|| {
                Error::network(format!(
                    "rank {r} published a TLS key not signed with this rank's \
                     RUSTDIST_AUTH_KEY: a different key there, or the store was tampered with"
                ))
            })
        })
        .collect()
}

fn describe_mode(mode: &str) -> String {
    let (mode, local) = match mode.strip_suffix("+local") {
        Some(m) => (m, " (also on one host)"),
        None => (mode, ""),
    };
    let what = match mode {
        "off" => "TLS off",
        "ca" => "TLS with certificate files",
        "pin" => "TLS with pinned keys",
        _ => "an unknown TLS mode",
    };
    format!("{what}{local}")
}

#[cfg(test)]
mod tests;
