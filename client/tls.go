package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Environment variables of the client's TLS material ([Discover], [TLSFromEnv], the CLI). Each is a
// path to a PEM file.
const (
	EnvCA         = "RUNNERD_CA"          // CA(s) that signed runnerd's certificate (--tls-cert)
	EnvClientCert = "RUNNERD_CLIENT_CERT" // client certificate, for a runnerd with --tls-client-ca
	EnvClientKey  = "RUNNERD_CLIENT_KEY"  // its key
)

// TLSFiles names the client's TLS material as PEM files. Empty fields are
// not used: no CA means the host's roots, no certificate means none is
// presented.
type TLSFiles struct {
	CA, Cert, Key string
}

// TLSFromEnv returns the files $RUNNERD_CA, $RUNNERD_CLIENT_CERT and
// $RUNNERD_CLIENT_KEY name.
func TLSFromEnv() TLSFiles {
	return TLSFiles{CA: os.Getenv(EnvCA), Cert: os.Getenv(EnvClientCert), Key: os.Getenv(EnvClientKey)}
}

// IsZero reports whether no file is named.
func (f TLSFiles) IsZero() bool { return f == TLSFiles{} }

// Apply loads the files into o (RootCAs, Certificate). A certificate
// without its key (or the reverse), an unreadable file, a CA file with no
// certificate, or a key that is not the certificate's is an error naming
// the file, and o is left as it was.
func (f TLSFiles) Apply(o *Options) error {
	if (f.Cert == "") != (f.Key == "") {
		return fmt.Errorf("client TLS: a client certificate and its key go together (%s, %s)", EnvClientCert, EnvClientKey)
	}
	var roots *x509.CertPool
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return fmt.Errorf("client TLS: read CA: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("client TLS: CA file %s holds no PEM certificate", f.CA)
		}
	}
	var cert *tls.Certificate
	if f.Cert != "" {
		c, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return fmt.Errorf("client TLS: load client certificate %s: %w", f.Cert, err)
		}
		cert = &c
	}
	if roots != nil {
		o.RootCAs = roots
	}
	if cert != nil {
		o.Certificate = cert
	}
	return nil
}

// tlsConfig is the transport's configuration for https endpoints: TLS
// 1.2 or later, the configured roots and client certificate.
func (o Options) tlsConfig() *tls.Config {
	conf := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: o.RootCAs, ServerName: o.ServerName}
	if o.Certificate != nil {
		conf.Certificates = []tls.Certificate{*o.Certificate}
	}
	return conf
}

// certAlerts are the TLS alerts a server sends when it refuses the
// client's certificate (RFC 8446 section 6.2): the caller's credential,
// not the network, is at fault.
var certAlerts = map[tls.AlertError]bool{
	42: true, 43: true, 44: true, 45: true, 46: true, // bad, unsupported, revoked, expired, unknown certificate
	48:  true, // unknown_ca
	49:  true, // access_denied
	116: true, // certificate_required
}

// isCertRefusal reports whether err says a certificate was refused: the
// server's (unknown authority, wrong name, expired) by this client, or
// this client's by the server (an alert).
func isCertRefusal(err error) bool {
	var verr *tls.CertificateVerificationError
	var uerr x509.UnknownAuthorityError
	var herr x509.HostnameError
	var ierr x509.CertificateInvalidError
	var alert tls.AlertError
	switch {
	case errors.As(err, &verr), errors.As(err, &uerr), errors.As(err, &herr), errors.As(err, &ierr):
		return true
	case errors.As(err, &alert):
		return certAlerts[alert]
	}
	// net/http flattens a read error of an idle connection with %v
	// ("readLoopPeekFailLocked: remote error: tls: certificate required"),
	// which is where TLS 1.3 delivers a server's refusal of the client's
	// certificate (after the client's side of the handshake is done), so
	// the alert's type is gone: match crypto/tls's own rendering of the
	// alert, built from the alert itself rather than spelled here.
	msg := err.Error()
	for a := range certAlerts {
		if strings.Contains(msg, a.Error()) {
			return true
		}
	}
	return false
}
