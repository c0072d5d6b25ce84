//! Client certificates: the CA bundle they must be signed by, the names they may carry, and
//! the verifier that swaps in a rotated CA while the server runs.

use std::path::Path;
use std::sync::{Arc, RwLock};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};

use super::{MAX_CLIENT_CAS, TlsError, provider};
use crate::core::echo::echo;

/// Parses a PEM bundle of CA certificates into a verifier that requires a
/// client certificate signed by one of them. Every certificate in the bundle must be a CA
/// (basicConstraints CA:TRUE): a leaf put there by mistake would otherwise become a trust
/// anchor of its own, and its holder would be let in.
pub fn load_client_ca(pem: &[u8], path: &Path) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let err = |detail: String| TlsError::ClientCa {
        path: path.to_path_buf(),
        detail,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(format!("malformed PEM: {e}")))?;
    if certs.is_empty() {
        return Err(err("no PEM certificate found".to_owned()));
    }
    if certs.len() > MAX_CLIENT_CAS {
        return Err(err(format!(
            "{} certificates; at most {MAX_CLIENT_CAS} CAs are read",
            certs.len()
        )));
    }
    let mut roots = RootCertStore::empty();
    for (i, cert) in certs.into_iter().enumerate() {
        let (_, parsed) = x509_parser::parse_x509_certificate(&cert)
            .map_err(|e| err(format!("certificate {}: not valid X.509: {e}", i + 1)))?;
        if !parsed.is_ca() {
            return Err(err(format!(
                "certificate {} ({}) is not a CA certificate (no basicConstraints CA:TRUE); \
                 only CAs may be trust anchors",
                i + 1,
                echo(&parsed.subject().to_string())
            )));
        }
        roots
            .add(cert)
            .map_err(|e| err(format!("not a CA certificate: {e}")))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| err(e.to_string()))
}

/// What a client certificate must carry besides a CA's signature: the clientAuth extended
/// key usage (a serving certificate signed by the same CA is not a client's), and, when
/// `allowed_names` is not empty, one of them as its subject's common name or a DNS, URI or
/// email subject alternative name.
pub fn check_client_cert(
    end_entity: &CertificateDer<'_>,
    allowed_names: &[String],
) -> Result<(), rustls::Error> {
    use rustls::CertificateError;
    use x509_parser::extensions::GeneralName;
    let bad = |e: CertificateError| rustls::Error::InvalidCertificate(e);
    let (_, cert) = x509_parser::parse_x509_certificate(end_entity)
        .map_err(|_| bad(CertificateError::BadEncoding))?;
    let client_auth = cert
        .extended_key_usage()
        .ok()
        .flatten()
        .is_some_and(|eku| eku.value.client_auth);
    if !client_auth {
        return Err(bad(CertificateError::InvalidPurpose));
    }
    if allowed_names.is_empty() {
        return Ok(());
    }
    let allowed = |name: &str| allowed_names.iter().any(|a| a == name);
    let by_cn = cert
        .subject()
        .iter_common_name()
        .any(|cn| cn.as_str().is_ok_and(allowed));
    let by_san = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .is_some_and(|san| {
            san.value.general_names.iter().any(|name| match name {
                GeneralName::DNSName(n) | GeneralName::URI(n) | GeneralName::RFC822Name(n) => {
                    allowed(n)
                }
                _ => false,
            })
        });
    if by_cn || by_san {
        Ok(())
    } else {
        Err(bad(CertificateError::NotValidForName))
    }
}

/// Verifies client certificates against the client CA in use; `replace`
/// swaps the CA for handshakes that start afterwards.
#[derive(Debug)]
pub struct ClientVerifier {
    current: RwLock<Arc<dyn ClientCertVerifier>>,
    /// `--client-ca-allowed-names`: empty allows any name the CA signed.
    allowed_names: Vec<String>,
}

impl ClientVerifier {
    pub fn new(verifier: Arc<dyn ClientCertVerifier>, allowed_names: Vec<String>) -> Self {
        Self {
            current: RwLock::new(verifier),
            allowed_names,
        }
    }

    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn replace(&self, verifier: Arc<dyn ClientCertVerifier>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = verifier;
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: they would have to outlive a CA swap. The API server has one client
    /// certificate per webhook (its kubeconfig) and sends it whatever the hints.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .current()
            .verify_client_cert(end_entity, intermediates, now)?;
        check_client_cert(end_entity, &self.allowed_names)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}
