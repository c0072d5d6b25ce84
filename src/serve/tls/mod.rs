//! The webhook's serving certificate: loading, validating, and swapping it
//! while the server runs.
//!
//! The API server calls the webhook over HTTPS only, and the certificate is
//! usually a Kubernetes Secret that cert-manager renews. A renewed Secret
//! shows up in the pod as new files (the kubelet swaps a `..data` symlink),
//! so the files are polled and a changed pair is loaded without a restart.
//! A broken renewal must never take the webhook down: the old certificate
//! stays in use and the failure is logged and counted.
//!
//! Here: the flags, loading a certificate and the server's rustls configuration; client
//! certificates in `client.rs`; the polling and swapping in `reload.rs`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{InconsistentKeys, ServerConfig};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

mod client;
pub mod metrics;
mod reload;

pub use client::{ClientVerifier, check_client_cert, load_client_ca};
use reload::Snapshot;

use super::parse::parse_duration;
use crate::certs;
use crate::metrics::Metrics;

/// The flags of the serving certificate and of client certificates.
#[derive(clap::Args, Clone, Debug)]
pub struct TlsArgs {
    /// PEM certificate chain to serve; re-read when the file changes. Without it, a
    /// self-signed certificate for localhost is made in memory (for trying it out only).
    #[arg(long, env = "GDG_TLS_CERT", requires = "tls_key", display_order = 2)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "GDG_TLS_KEY", requires = "tls_cert", display_order = 3)]
    pub tls_key: Option<PathBuf>,
    /// With the self-signed certificate: write its CA here so a client can trust it.
    #[arg(
        long,
        env = "GDG_WRITE_CA",
        conflicts_with = "tls_cert",
        display_order = 4
    )]
    pub write_ca: Option<PathBuf>,
    /// PEM CA bundle: require a client certificate signed by it (the API server presents one
    /// when its AdmissionConfiguration gives the webhook a kubeconfig; see
    /// docs/client-certificates.md). Re-read when the file changes.
    #[arg(long, env = "GDG_CLIENT_CA", display_order = 14)]
    pub client_ca: Option<PathBuf>,
    /// With --client-ca: the names a client certificate may carry (its subject's common name,
    /// or a DNS, URI or email subject alternative name), comma-separated; empty allows any
    /// certificate the CA signed. The clientAuth extended key usage is always required.
    #[arg(
        long,
        env = "GDG_CLIENT_CA_ALLOWED_NAMES",
        value_delimiter = ',',
        requires = "client_ca",
        display_order = 15
    )]
    pub client_ca_allowed_names: Vec<String>,
    /// How often the certificate files are checked for rotation.
    #[arg(long, env = "GDG_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration,
          display_order = 32)]
    pub tls_reload_interval: Duration,
}

impl TlsArgs {
    /// The files given, else a self-signed certificate.
    pub fn source(&self) -> TlsSource {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => TlsSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            _ => TlsSource::SelfSigned {
                write_ca: self.write_ca.clone(),
            },
        }
    }
}

/// Where the serving certificate comes from.
#[derive(Clone, Debug)]
pub enum TlsSource {
    /// PEM files, typically a mounted `kubernetes.io/tls` Secret. `cert` may
    /// hold intermediates after the leaf; `key` is PKCS#8, PKCS#1 or SEC1.
    Files { cert: PathBuf, key: PathBuf },
    /// A CA and certificate for localhost made at start-up, for trying the
    /// webhook out. The CA is written to `write_ca` so a client can trust it.
    SelfSigned { write_ca: Option<PathBuf> },
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: no PEM certificate found", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: no PEM private key found", path.display())]
    NoKey { path: PathBuf },
    #[error("{}: malformed PEM: {detail}", path.display())]
    Pem { path: PathBuf, detail: String },
    #[error("{}: not a valid X.509 certificate: {detail}", path.display())]
    Certificate { path: PathBuf, detail: String },
    #[error("{}: unusable private key: {source}", path.display())]
    Key {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("{}: private key does not belong to the certificate in {}", key.display(), cert.display())]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("{}: certificate expired at {not_after}", path.display())]
    Expired { path: PathBuf, not_after: String },
    #[error("{}: certificate not valid before {not_before}", path.display())]
    NotYetValid { path: PathBuf, not_before: String },
    #[error("{}: {count} certificates in the chain; at most {MAX_CHAIN} are served", path.display())]
    ChainTooLong { path: PathBuf, count: usize },
    #[error("generating a self-signed certificate: {0}")]
    SelfSigned(#[from] certs::CertError),
    #[error("{}: cannot write the self-signed CA: {source}", path.display())]
    WriteCa {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("building the TLS configuration: {0}")]
    Config(rustls::Error),
    #[error("{}: not usable as client CA: {detail}", path.display())]
    ClientCa { path: PathBuf, detail: String },
}

impl TlsError {
    /// The `reason` label of `gpu_deploy_guard_tls_certificate_reload_failures_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            TlsError::Read { .. } => "unreadable",
            TlsError::Expired { .. } => "expired",
            TlsError::NotYetValid { .. } => "not-yet-valid",
            _ => "invalid",
        }
    }
}

/// The largest certificate, key or CA file read: a chain of a few certificates is a few KiB,
/// and a CA bundle as large as a distribution's (about 150 CAs) fits too.
pub const MAX_PEM_BYTES: u64 = 256 * 1024;

/// The most certificates in a served chain (leaf and intermediates).
pub const MAX_CHAIN: usize = 8;

/// The most CA certificates in a `--client-ca` bundle.
pub const MAX_CLIENT_CAS: usize = 200;

/// A validated certificate chain with its key.
#[derive(Clone, Debug)]
pub struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    /// Start of the leaf certificate's validity, in Unix seconds.
    pub not_before: i64,
    /// Expiry of the leaf certificate, in Unix seconds.
    pub not_after: i64,
}

impl LoadedCert {
    /// Whether the leaf is valid at `now` (Unix seconds).
    pub fn valid_at(&self, now: i64) -> bool {
        self.not_before <= now && now < self.not_after
    }
}

/// Now, in Unix seconds.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Reads a certificate, key or CA file: regular, at most [`MAX_PEM_BYTES`].
fn read_pem_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    crate::k8s::read::regular_file(path, MAX_PEM_BYTES).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The ring provider, named explicitly so that nothing depends on a
/// process-wide default provider being installed (or on aws-lc).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses and validates a certificate chain and key: the PEM parses, the chain is at most
/// [`MAX_CHAIN`] long, the leaf is X.509, the key is usable and belongs to the leaf, and the
/// leaf is valid now (not expired, not yet to come: a client would refuse either, so it is
/// never served). The paths only name the sources in errors.
pub fn load_pem(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<LoadedCert, TlsError> {
    let pem_err = |path: &Path, e: pem::Error| TlsError::Pem {
        path: path.to_path_buf(),
        detail: e.to_string(),
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(cert_path, e))?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_path_buf(),
        });
    };
    if chain.len() > MAX_CHAIN {
        return Err(TlsError::ChainTooLong {
            path: cert_path.to_path_buf(),
            count: chain.len(),
        });
    }
    let (_, parsed) =
        x509_parser::parse_x509_certificate(leaf).map_err(|e| TlsError::Certificate {
            path: cert_path.to_path_buf(),
            detail: e.to_string(),
        })?;
    let (not_before, not_after) = (parsed.validity().not_before, parsed.validity().not_after);
    let now = unix_now();
    if not_after.timestamp() <= now {
        return Err(TlsError::Expired {
            path: cert_path.to_path_buf(),
            not_after: not_after.to_string(),
        });
    }
    if not_before.timestamp() > now {
        return Err(TlsError::NotYetValid {
            path: cert_path.to_path_buf(),
            not_before: not_before.to_string(),
        });
    }

    let key_der = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoKey {
            path: key_path.to_path_buf(),
        },
        e => pem_err(key_path, e),
    })?;
    let signing_key = provider()
        .key_provider
        .load_private_key(key_der)
        .map_err(|source| TlsError::Key {
            path: key_path.to_path_buf(),
            source,
        })?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        // ring's keys always expose their public key, so Unknown does not
        // happen in practice; accepting it matches rustls' own from_der.
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => {
            return Err(TlsError::KeyMismatch {
                cert: cert_path.to_path_buf(),
                key: key_path.to_path_buf(),
            });
        }
        Err(e) => {
            return Err(TlsError::Certificate {
                path: cert_path.to_path_buf(),
                detail: e.to_string(),
            });
        }
    }
    Ok(LoadedCert {
        key: Arc::new(certified),
        not_before: not_before.timestamp(),
        not_after: not_after.timestamp(),
    })
}

/// Reads and validates a certificate and key file.
pub fn load_files(cert: &Path, key: &Path) -> Result<LoadedCert, TlsError> {
    let (cert_pem, key_pem) = read_pair(cert, key)?;
    load_pem(&cert_pem, &key_pem, cert, key)
}

fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    Ok((read_pem_file(cert)?, read_pem_file(key)?))
}

/// Hands rustls the current certificate for every handshake; `replace`
/// swaps it for handshakes that start afterwards. Connections already
/// established keep the certificate they were made with.
#[derive(Debug)]
pub struct CertResolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertResolver {
    pub fn new(key: Arc<CertifiedKey>) -> Self {
        Self {
            current: RwLock::new(key),
        }
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        // A poisoned lock still holds a valid Arc: a panic elsewhere must not
        // stop TLS from working.
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn replace(&self, key: Arc<CertifiedKey>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = key;
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The rustls configuration the webhook serves with: TLS 1.2 and 1.3 only
/// (the API server supports both; older versions are broken), ALPN for
/// HTTP/2 and HTTP/1.1. Client certificates are required when `client` is
/// given (`serve --client-ca`), and not asked for otherwise.
fn server_config(
    resolver: Arc<CertResolver>,
    client: Option<Arc<ClientVerifier>>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(TlsError::Config)?;
    let builder = match client {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver);
    // No session resumption: a resumed session skips client-certificate verification, so a
    // client authenticated by a CA since removed from --client-ca would keep reconnecting on
    // its old session. The API server keeps its connections; full handshakes are rare.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The certificate state of a server: built before any port is bound, so
/// a bad certificate stops start-up with a message naming the file.
pub struct Tls {
    resolver: Arc<CertResolver>,
    config: Arc<ServerConfig>,
    /// The files to poll and what they held when last read.
    watched: Option<(PathBuf, PathBuf, Snapshot)>,
    /// When the certificate in use starts and stops being valid, in Unix seconds.
    validity: (i64, i64),
    /// The client CA file, what it held when last read, and the verifier using it.
    client_ca: Option<(PathBuf, Vec<u8>, Arc<ClientVerifier>)>,
}

impl Tls {
    /// Loads (or generates) the certificate and records its expiry; with
    /// `client_ca`, loads the CA that client certificates must be signed by.
    pub fn load(
        source: &TlsSource,
        client_ca: Option<&Path>,
        allowed_names: &[String],
        metrics: &Metrics,
    ) -> Result<Self, TlsError> {
        let client_ca = match client_ca {
            Some(path) => {
                let pem = read_pem_file(path)?;
                let verifier = Arc::new(ClientVerifier::new(
                    load_client_ca(&pem, path)?,
                    allowed_names.to_vec(),
                ));
                info!(client_ca = %path.display(), allowed_names = ?allowed_names,
                      "client certificates required");
                Some((path.to_path_buf(), pem, verifier))
            }
            None => None,
        };
        let (loaded, watched) = match source {
            TlsSource::Files { cert, key } => {
                let (cert_pem, key_pem) = read_pair(cert, key)?;
                let loaded = load_pem(&cert_pem, &key_pem, cert, key)?;
                info!(cert = %cert.display(), key = %key.display(), "loaded serving certificate");
                let seen = Snapshot::Read(cert_pem, key_pem);
                (loaded, Some((cert.clone(), key.clone(), seen)))
            }
            TlsSource::SelfSigned { write_ca } => (self_signed(write_ca.as_deref())?, None),
        };
        metrics.tls.set_cert_expiry(loaded.not_after);
        let validity = (loaded.not_before, loaded.not_after);
        let resolver = Arc::new(CertResolver::new(loaded.key));
        let config = server_config(
            resolver.clone(),
            client_ca.as_ref().map(|(_, _, v)| v.clone()),
        )?;
        Ok(Self {
            resolver,
            config,
            watched,
            validity,
            client_ca,
        })
    }

    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.clone())
    }
}

fn self_signed(write_ca: Option<&Path>) -> Result<LoadedCert, TlsError> {
    let bundle = certs::generate(
        &["localhost".to_string()],
        &[
            std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::Ipv6Addr::LOCALHOST.into(),
        ],
        365,
    )?;
    warn!(
        "SERVING A SELF-SIGNED CERTIFICATE FOR localhost: for trying the webhook out only; \
         the API server cannot reach or trust it. Serve a certificate from files in a cluster."
    );
    if let Some(path) = write_ca {
        std::fs::write(path, &bundle.ca_pem).map_err(|source| TlsError::WriteCa {
            path: path.to_path_buf(),
            source,
        })?;
        info!(path = %path.display(), "wrote the self-signed CA; trust it to call the webhook");
    }
    let name = Path::new("<self-signed>");
    load_pem(
        bundle.cert_pem.as_bytes(),
        bundle.key_pem.as_bytes(),
        name,
        name,
    )
}
