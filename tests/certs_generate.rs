//! Certificate generation and the files the `certs` subcommand writes.

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use base64::Engine;
use gpu_deploy_guard::certs::{self, CertError};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::{RootCertStore, crypto::ring};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use x509_parser::extensions::GeneralName;

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("PEM certificate")
}

fn names() -> (Vec<String>, Vec<IpAddr>) {
    (
        vec![
            "gpu-deploy-guard.gpu-operator.svc".to_string(),
            "gpu-deploy-guard.gpu-operator.svc.cluster.local".to_string(),
        ],
        vec!["10.96.0.42".parse().unwrap(), "::1".parse().unwrap()],
    )
}

#[test]
fn leaf_has_requested_names_and_validity() {
    let (dns, ips) = names();
    let bundle = certs::generate(&dns, &ips, 30).unwrap();
    let leaf_der = der(&bundle.cert_pem);
    let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).unwrap();

    let san = leaf
        .subject_alternative_name()
        .unwrap()
        .expect("leaf has a SAN extension");
    let mut got_dns = Vec::new();
    let mut got_ips = Vec::new();
    for name in &san.value.general_names {
        match name {
            GeneralName::DNSName(d) => got_dns.push(d.to_string()),
            GeneralName::IPAddress(raw) => got_ips.push(match raw.len() {
                4 => IpAddr::from(<[u8; 4]>::try_from(*raw).unwrap()),
                16 => IpAddr::from(<[u8; 16]>::try_from(*raw).unwrap()),
                n => panic!("IP SAN of {n} bytes"),
            }),
            other => panic!("unexpected SAN {other:?}"),
        }
    }
    assert_eq!(got_dns, dns);
    assert_eq!(got_ips, ips);
    assert!(!leaf.is_ca());

    let days = (leaf.validity().not_after.timestamp() - leaf.validity().not_before.timestamp())
        as f64
        / 86_400.0;
    assert!((29.9..30.1).contains(&days), "validity {days} days");
}

#[test]
fn leaf_chains_to_the_ca_and_not_to_another() {
    let (dns, ips) = names();
    let bundle = certs::generate(&dns, &ips, 30).unwrap();
    let other = certs::generate(&dns, &ips, 30).unwrap();

    let ca_der = der(&bundle.ca_pem);
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    assert!(ca.is_ca(), "ca.crt is a CA certificate");

    let verify = |ca_pem: &str, name: &str| {
        let mut roots = RootCertStore::empty();
        roots.add(der(ca_pem)).unwrap();
        let verifier = WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(ring::default_provider()),
        )
        .build()
        .unwrap();
        verifier.verify_server_cert(
            &der(&bundle.cert_pem),
            &[],
            &ServerName::try_from(name.to_string()).unwrap(),
            &[],
            UnixTime::now(),
        )
    };
    verify(&bundle.ca_pem, "gpu-deploy-guard.gpu-operator.svc").expect("chains to its CA");
    verify(&bundle.ca_pem, "10.96.0.42").expect("valid for the IP SAN");
    assert!(verify(&other.ca_pem, "gpu-deploy-guard.gpu-operator.svc").is_err());
    assert!(verify(&bundle.ca_pem, "elsewhere.example").is_err());
}

#[test]
fn every_bundle_is_fresh() {
    let (dns, ips) = names();
    let a = certs::generate(&dns, &ips, 1).unwrap();
    let b = certs::generate(&dns, &ips, 1).unwrap();
    assert_ne!(a.key_pem, b.key_pem);
    let serial = |pem: &str| {
        let d = der(pem);
        let (_, c) = x509_parser::parse_x509_certificate(&d).unwrap();
        c.raw_serial().to_vec()
    };
    assert_ne!(serial(&a.cert_pem), serial(&b.cert_pem));
    assert_ne!(serial(&a.ca_pem), serial(&b.ca_pem));
}

#[test]
fn bad_parameters_are_refused() {
    assert!(matches!(
        certs::generate(&[], &[], 30),
        Err(CertError::NoNames)
    ));
    assert!(matches!(
        certs::generate(&["ok.example".into()], &[], 0),
        Err(CertError::Validity(0))
    ));
    assert!(matches!(
        certs::generate(&["ok.example".into()], &[], u32::MAX),
        Err(CertError::Validity(_))
    ));
    let err = certs::generate(&["bad name.example".into()], &[], 30).unwrap_err();
    assert!(err.to_string().contains("bad name.example"), "{err}");
    // IP addresses alone are enough.
    certs::generate(&[], &["127.0.0.1".parse().unwrap()], 30).unwrap();
}

#[test]
fn ca_bundle_is_base64_of_the_ca_pem() {
    let bundle = certs::generate(&["a.example".into()], &[], 1).unwrap();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(certs::ca_bundle_base64(&bundle))
        .unwrap();
    assert_eq!(decoded, bundle.ca_pem.as_bytes());
    assert!(!format!("{bundle:?}").contains("PRIVATE KEY"));
}

#[test]
fn write_dir_writes_three_files_with_a_private_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("nested").join("certs");
    let bundle = certs::generate(&["a.example".into()], &[], 1).unwrap();
    certs::write_dir(&dir, &bundle, false).unwrap();

    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    assert_eq!(read("ca.crt"), bundle.ca_pem);
    assert_eq!(read("tls.crt"), bundle.cert_pem);
    assert_eq!(read("tls.key"), bundle.key_pem);
    let mode = |f: &str| std::fs::metadata(dir.join(f)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode("tls.key"), 0o600);
    assert_eq!(mode("tls.crt") & 0o600, 0o600);
}

#[test]
fn write_dir_refuses_to_overwrite_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let first = certs::generate(&["a.example".into()], &[], 1).unwrap();
    let second = certs::generate(&["a.example".into()], &[], 1).unwrap();

    // Only tls.key exists: nothing may be written, and the error names it.
    std::fs::write(dir.join("tls.key"), "keep me").unwrap();
    let err = certs::write_dir(dir, &first, false).unwrap_err();
    assert!(matches!(err, CertError::Exists { .. }), "{err:?}");
    assert!(err.to_string().contains("tls.key"), "{err}");
    assert!(!dir.join("ca.crt").exists(), "refusal wrote ca.crt");
    assert!(!dir.join("tls.crt").exists(), "refusal wrote tls.crt");
    assert_eq!(
        std::fs::read_to_string(dir.join("tls.key")).unwrap(),
        "keep me"
    );

    // With force the whole set is replaced, and the key gets mode 0600 even
    // though the file it replaces was created world-readable.
    std::fs::set_permissions(dir.join("tls.key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    certs::write_dir(dir, &first, true).unwrap();
    certs::write_dir(dir, &second, true).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("tls.key")).unwrap(),
        second.key_pem
    );
    let mode = std::fs::metadata(dir.join("tls.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 3, "temporary files left: {leftovers:?}");
}
