package framework

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a throwaway certificate authority for one control plane. The API
// server trusts it for client certificates, and tests can use it to issue a
// serving certificate for the webhook under test (put CertPEM in the
// webhook's caBundle).
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     crypto.Signer
}

// NewCA creates a self-signed CA valid for 24 hours.
func NewCA(commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), key: key}, nil
}

// CertSpec describes a leaf certificate to issue.
type CertSpec struct {
	CommonName    string
	Organizations []string // client certs: Kubernetes groups
	DNSNames      []string
	IPs           []net.IP
	Server        bool // ExtKeyUsageServerAuth
	Client        bool // ExtKeyUsageClientAuth
}

// Issue signs a new ECDSA P-256 leaf certificate. It returns PEM-encoded
// certificate and private key.
func (ca *CA) Issue(spec CertSpec) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: spec.CommonName, Organization: spec.Organizations},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     spec.DNSNames,
		IPAddresses:  spec.IPs,
	}
	if spec.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if spec.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = ecPrivateKeyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), keyPEM, nil
}

// IssueServingCert issues a TLS server certificate for the given host names
// and IP addresses (strings that parse as IPs become IP SANs).
func (ca *CA) IssueServingCert(hosts ...string) (certPEM, keyPEM []byte, err error) {
	spec := CertSpec{CommonName: "serving", Server: true}
	if len(hosts) > 0 {
		spec.CommonName = hosts[0]
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			spec.IPs = append(spec.IPs, ip)
		} else {
			spec.DNSNames = append(spec.DNSNames, h)
		}
	}
	return ca.Issue(spec)
}

// writeKeyPair writes <dir>/<name>.crt and <dir>/<name>.key.
func writeKeyPair(dir, name string, certPEM, keyPEM []byte) (certFile, keyFile string, err error) {
	certFile = filepath.Join(dir, name+".crt")
	keyFile = filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// writeServiceAccountKeys writes the key pair the API server signs
// service-account tokens with (private) and verifies them with (public);
// kube-controller-manager gets the private key too.
func writeServiceAccountKeys(dir string) (privFile, pubFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	privPEM, err := ecPrivateKeyPEM(key)
	if err != nil {
		return "", "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return "", "", err
	}
	privFile = filepath.Join(dir, "service-account.key")
	pubFile = filepath.Join(dir, "service-account.pub")
	if err := os.WriteFile(privFile, privPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(pubFile, pemBlock("PUBLIC KEY", pubDER), 0o644); err != nil {
		return "", "", err
	}
	return privFile, pubFile, nil
}

func ecPrivateKeyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal EC key: %w", err)
	}
	return pemBlock("EC PRIVATE KEY", der), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}
