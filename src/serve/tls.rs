//! The webhook's serving certificate: loading, validating, and swapping it
//! while the server runs.
//!
//! The API server calls the webhook over HTTPS only, and the certificate is
//! usually a Kubernetes Secret that cert-manager renews. A renewed Secret
//! shows up in the pod as new files (the kubelet swaps a `..data` symlink),
//! so the files are polled and a changed pair is loaded without a restart.
//! A broken renewal must never take the webhook down: the old certificate
//! stays in use and the failure is logged and counted.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{InconsistentKeys, ServerConfig};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use crate::certs;
use crate::metrics::Metrics;

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
    #[error("generating a self-signed certificate: {0}")]
    SelfSigned(#[from] certs::CertError),
    #[error("{}: cannot write the self-signed CA: {source}", path.display())]
    WriteCa {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("building the TLS configuration: {0}")]
    Config(rustls::Error),
}

/// A validated certificate chain with its key.
#[derive(Clone, Debug)]
pub struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    /// Expiry of the leaf certificate, in Unix seconds.
    pub not_after: i64,
}

/// The ring provider, named explicitly so that nothing depends on a
/// process-wide default provider being installed (or on aws-lc).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses and validates a certificate chain and key: the PEM parses, the
/// leaf is X.509, the key is usable and belongs to the leaf, and the leaf
/// has not expired. The paths only name the sources in errors.
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
    let (_, parsed) =
        x509_parser::parse_x509_certificate(leaf).map_err(|e| TlsError::Certificate {
            path: cert_path.to_path_buf(),
            detail: e.to_string(),
        })?;
    let not_after = parsed.validity().not_after;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    if not_after.timestamp() <= now {
        return Err(TlsError::Expired {
            path: cert_path.to_path_buf(),
            not_after: not_after.to_string(),
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
        not_after: not_after.timestamp(),
    })
}

/// Reads and validates a certificate and key file.
pub fn load_files(cert: &Path, key: &Path) -> Result<LoadedCert, TlsError> {
    let (cert_pem, key_pem) = read_pair(cert, key)?;
    load_pem(&cert_pem, &key_pem, cert, key)
}

fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    Ok((read(cert)?, read(key)?))
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
/// HTTP/2 and HTTP/1.1, no client certificates (the API server does not
/// send one unless configured to, and authorization is not this layer's job).
fn server_config(resolver: Arc<CertResolver>) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
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
}

impl Tls {
    /// Loads (or generates) the certificate and records its expiry.
    pub fn load(source: &TlsSource, metrics: &Metrics) -> Result<Self, TlsError> {
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
        metrics.set_cert_expiry(loaded.not_after);
        let resolver = Arc::new(CertResolver::new(loaded.key));
        let config = server_config(resolver.clone())?;
        Ok(Self {
            resolver,
            config,
            watched,
        })
    }

    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.clone())
    }

    /// Starts polling the certificate files every `interval`, if the
    /// certificate came from files. The task runs until aborted.
    pub fn spawn_reloader(
        &self,
        interval: Duration,
        metrics: Arc<Metrics>,
    ) -> Option<JoinHandle<()>> {
        let (cert, key, seen) = self.watched.clone()?;
        let reloader = Reloader {
            cert,
            key,
            seen,
            resolver: self.resolver.clone(),
            metrics,
        };
        // tokio's interval panics on zero; Server::bind already refuses it,
        // this only keeps a direct caller from crashing the process.
        let interval = interval.max(Duration::from_millis(10));
        Some(tokio::spawn(reloader.run(interval)))
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

/// What the certificate files held at the last poll. Contents are compared
/// rather than modification times: the kubelet replaces a Secret by
/// re-pointing a symlink, which leaves the visible paths' times unreliable.
#[derive(Clone, PartialEq, Eq)]
enum Snapshot {
    Read(Vec<u8>, Vec<u8>),
    Unreadable(String),
}

struct Reloader {
    cert: PathBuf,
    key: PathBuf,
    seen: Snapshot,
    resolver: Arc<CertResolver>,
    metrics: Arc<Metrics>,
}

impl Reloader {
    async fn run(mut self, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick fires at once; the files were just loaded.
        ticker.tick().await;
        loop {
            ticker.tick().await;
            self.poll().await;
        }
    }

    async fn read(&self) -> Snapshot {
        let read = |path: PathBuf| async move {
            tokio::fs::read(&path)
                .await
                .map_err(|e| format!("{}: cannot read: {e}", path.display()))
        };
        match (read(self.cert.clone()).await, read(self.key.clone()).await) {
            (Ok(cert), Ok(key)) => Snapshot::Read(cert, key),
            (Err(e), _) | (_, Err(e)) => Snapshot::Unreadable(e),
        }
    }

    /// Loads the files if they changed since the last poll. Each distinct
    /// broken state is reported once, not on every poll.
    async fn poll(&mut self) {
        let now = self.read().await;
        if now == self.seen {
            return;
        }
        let result = match &now {
            Snapshot::Read(cert, key) => {
                load_pem(cert, key, &self.cert, &self.key).map_err(|e| e.to_string())
            }
            Snapshot::Unreadable(e) => Err(e.clone()),
        };
        match result {
            Ok(loaded) => {
                self.resolver.replace(loaded.key);
                self.metrics.set_cert_expiry(loaded.not_after);
                self.metrics.observe_cert_reload(true);
                info!(cert = %self.cert.display(), not_after = loaded.not_after,
                      "serving a rotated certificate");
            }
            Err(error) => {
                // The two files are read one after the other; one that was
                // caught between the cert and the key of a non-atomic update
                // is not a failure yet. Look again at the next poll.
                if self.read().await != now {
                    return;
                }
                warn!(%error, "rotated certificate is unusable; still serving the previous one");
                self.metrics.observe_cert_reload(false);
            }
        }
        self.seen = now;
    }
}
