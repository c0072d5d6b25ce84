//! Certificate generation for the webhook: a private CA and a serving
//! certificate signed by it.
//!
//! The API server only trusts the webhook through the `caBundle` of the
//! webhook configuration, so a throw-away CA per installation is enough; this
//! module makes one (and the `certs` subcommand writes it out) for clusters
//! without cert-manager and for trying the webhook out.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::DnsName;
use time::{Duration, OffsetDateTime};

/// File names inside a certificate directory; the same keys a
/// `kubernetes.io/tls` Secret (plus `ca.crt`) mounts, so a directory written
/// here and a mounted Secret look alike to the server.
pub const CA_FILE: &str = "ca.crt";
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// Certificates are back-dated by this much so that a node whose clock is a
/// little behind the one that generated them does not see them as not yet
/// valid.
const BACKDATE: Duration = Duration::minutes(5);

/// A CA and a serving certificate signed by it, all PEM encoded.
#[derive(Clone)]
pub struct Bundle {
    pub ca_pem: String,
    pub cert_pem: String,
    /// PKCS#8 private key of `cert_pem`.
    pub key_pem: String,
}

// The private key must not end up in logs through a stray `{:?}`.
impl std::fmt::Debug for Bundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bundle")
            .field("ca_pem", &self.ca_pem)
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("no DNS name or IP address given: a certificate without names cannot be verified")]
    NoNames,
    #[error("invalid DNS name {0:?}")]
    InvalidDnsName(String),
    #[error("validity of {0} days is out of range (1 to 36500)")]
    Validity(u32),
    #[error("generating the certificate failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{}: already exists (use --force to overwrite)", path.display())]
    Exists { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// Generates a fresh CA and a serving certificate for `dns` and `ips`, both
/// valid for `validity_days` from now. Keys are ECDSA P-256: small, fast and
/// accepted by every Kubernetes API server.
pub fn generate(dns: &[String], ips: &[IpAddr], validity_days: u32) -> Result<Bundle, CertError> {
    if dns.is_empty() && ips.is_empty() {
        return Err(CertError::NoNames);
    }
    if !(1..=36_500).contains(&validity_days) {
        return Err(CertError::Validity(validity_days));
    }
    let mut sans = Vec::with_capacity(dns.len() + ips.len());
    for name in dns {
        // rcgen accepts any ASCII string; a typo such as "svc .ns" would give a
        // certificate no client can match, so reject what is not a hostname.
        if DnsName::try_from(name.as_str()).is_err() {
            return Err(CertError::InvalidDnsName(name.clone()));
        }
        sans.push(SanType::DnsName(name.as_str().try_into()?));
    }
    sans.extend(ips.iter().copied().map(SanType::IpAddress));

    let now = OffsetDateTime::now_utc();
    let not_before = now - BACKDATE;
    let not_after = now + Duration::days(i64::from(validity_days));

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = name("gpu-deploy-guard CA");
    // Path length 0: this CA signs serving certificates only, never another CA.
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let leaf_key = KeyPair::generate()?;
    let mut leaf_params = CertificateParams::default();
    let common_name = dns
        .first()
        .map(String::as_str)
        .unwrap_or("gpu-deploy-guard");
    leaf_params.distinguished_name = name(common_name);
    leaf_params.subject_alt_names = sans;
    leaf_params.is_ca = IsCa::ExplicitNoCa;
    leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf_params.use_authority_key_identifier_extension = true;
    leaf_params.not_before = not_before;
    leaf_params.not_after = not_after;
    // The serial number defaults to a digest of the (fresh, random) public
    // key, so every generated certificate has a distinct one.
    let leaf_cert = leaf_params.signed_by(&leaf_key, &issuer)?;

    Ok(Bundle {
        ca_pem: ca_cert.pem(),
        cert_pem: leaf_cert.pem(),
        key_pem: leaf_key.serialize_pem(),
    })
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// Writes `dir/ca.crt`, `dir/tls.crt` and `dir/tls.key`, creating `dir` if
/// needed. The key is written with mode 0600. Without `force`, nothing is
/// written if any of the three files already exists.
pub fn write_dir(dir: &Path, bundle: &Bundle, force: bool) -> Result<(), CertError> {
    fs::create_dir_all(dir).map_err(|source| CertError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let files = [
        (CA_FILE, bundle.ca_pem.as_str(), 0o644),
        (CERT_FILE, bundle.cert_pem.as_str(), 0o644),
        (KEY_FILE, bundle.key_pem.as_str(), 0o600),
    ];
    if !force {
        // Check all three first so that a refusal leaves the directory as it
        // was instead of half-replaced.
        for (file, _, _) in &files {
            let path = dir.join(file);
            // symlink_metadata: a dangling symlink is still "something there".
            if fs::symlink_metadata(&path).is_ok() {
                return Err(CertError::Exists { path });
            }
        }
    }
    for (file, contents, mode) in files {
        write_file(&dir.join(file), contents.as_bytes(), mode, force)?;
    }
    Ok(())
}

/// Writes one file with `mode` from the moment it exists, so the key is
/// never readable by others, not even briefly.
fn write_file(path: &Path, contents: &[u8], mode: u32, force: bool) -> Result<(), CertError> {
    let io_err = |source| CertError::Io {
        path: path.to_path_buf(),
        source,
    };
    if !force {
        // create_new closes the race between the existence check and the
        // write: a file that appeared meanwhile is still not overwritten.
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .map_err(|source| match source.kind() {
                io::ErrorKind::AlreadyExists => CertError::Exists {
                    path: path.to_path_buf(),
                },
                _ => io_err(source),
            })?;
        return file
            .write_all(contents)
            .and_then(|()| file.sync_all())
            .map_err(io_err);
    }
    // Overwriting: write a temporary file next to the target and rename it
    // over, so the mode is the one asked for (an existing file keeps its own
    // mode when truncated) and readers never see a half-written file.
    let file_name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        // A stale temporary file from a crashed run may have other bits.
        fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(io_err)
}

/// The CA in the form a webhook configuration's `caBundle` field takes.
pub fn ca_bundle_base64(bundle: &Bundle) -> String {
    base64::engine::general_purpose::STANDARD.encode(bundle.ca_pem.as_bytes())
}
