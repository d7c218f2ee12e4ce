package move

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/agentrunner/runner/adapter"
)

// Credentials are an S3 access key pair. They never print: String,
// GoString and Format show only whether they are set, so a Config logged
// or wrapped into an error carries no secret.
type Credentials struct {
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string // optional (temporary credentials)
}

// String redacts the credentials.
func (c Credentials) String() string {
	if c.AccessKeyID == "" && c.SecretAccessKey == "" {
		return "[no credentials]"
	}
	return "[credentials redacted]"
}

// GoString redacts the credentials for %#v.
func (c Credentials) GoString() string { return c.String() }

// Format redacts the credentials for every verb.
func (c Credentials) Format(f fmt.State, _ rune) { io.WriteString(f, c.String()) }

// MarshalJSON redacts the credentials in JSON (slog's JSON handler
// marshals a struct's exported fields otherwise).
func (c Credentials) MarshalJSON() ([]byte, error) { return json.Marshal(c.String()) }

// LogValue redacts the credentials in slog.
func (c Credentials) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Environment variable names of the credentials, as the AWS tools read
// them.
const (
	EnvAccessKeyID     = "AWS_ACCESS_KEY_ID"
	EnvSecretAccessKey = "AWS_SECRET_ACCESS_KEY"
	EnvSessionToken    = "AWS_SESSION_TOKEN"
)

// ErrNoCredentials is returned (wrapped) by CredentialsFromEnv and
// CredentialsFromFile when the access key or the secret is missing.
var ErrNoCredentials = errors.New("no S3 credentials")

// CredentialsFromEnv reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
// (optional) AWS_SESSION_TOKEN.
func CredentialsFromEnv() (Credentials, error) {
	c := Credentials{AccessKeyID: os.Getenv(EnvAccessKeyID), SecretAccessKey: os.Getenv(EnvSecretAccessKey), SessionToken: os.Getenv(EnvSessionToken)}
	if c.AccessKeyID == "" || c.SecretAccessKey == "" {
		return Credentials{}, fmt.Errorf("read %s and %s: %w", EnvAccessKeyID, EnvSecretAccessKey, ErrNoCredentials)
	}
	return c, nil
}

// CredentialsFromFile reads the same three names from a file of NAME=value
// lines (an env file: blank lines and # comments skipped, values taken as
// they are, no quotes). The file must not be readable by group or others:
// a key pair anyone on the host reads is refused. Errors never quote a
// line of the file.
func CredentialsFromFile(path string) (Credentials, error) {
	f, err := os.Open(path)
	if err != nil {
		return Credentials{}, fmt.Errorf("open credentials file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Credentials{}, fmt.Errorf("stat credentials file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return Credentials{}, fmt.Errorf("credentials file %s has mode %04o: want no access for group and others (chmod 600)", path, fi.Mode().Perm())
	}
	var c Credentials
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok {
			return Credentials{}, fmt.Errorf("credentials file %s line %d: want NAME=value", path, n)
		}
		switch strings.TrimSpace(k) {
		case EnvAccessKeyID:
			c.AccessKeyID = strings.TrimSpace(v)
		case EnvSecretAccessKey:
			c.SecretAccessKey = strings.TrimSpace(v)
		case EnvSessionToken:
			c.SessionToken = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		return Credentials{}, fmt.Errorf("read credentials file %s: %w", path, err)
	}
	if c.AccessKeyID == "" || c.SecretAccessKey == "" {
		return Credentials{}, fmt.Errorf("credentials file %s: %s and %s: %w", path, EnvAccessKeyID, EnvSecretAccessKey, ErrNoCredentials)
	}
	return c, nil
}

// Config names the bucket archives and leases live in.
type Config struct {
	// Endpoint is the S3 server's host[:port], without a scheme.
	Endpoint string
	// Secure selects HTTPS.
	Secure bool
	// Region is the bucket's region ("" lets the client ask).
	Region string
	// Bucket must exist; Open does not make it.
	Bucket string
	// Prefix is prepended to every key (e.g. "runner/"), so one bucket
	// serves several fleets.
	Prefix string
	// Credentials sign every request (CredentialsFromEnv, or
	// CredentialsFromFile).
	Credentials Credentials
	// Transport, if set, carries the requests (a custom CA, a proxy).
	Transport http.RoundTripper
}

// Store is the bucket: archives, routes and leases under Config.Prefix.
// It is safe for concurrent use and holds no resource to close.
type Store struct {
	mc     *minio.Client
	bucket string
	prefix string
}

// Open checks that the bucket exists and answers with these credentials.
// A refused credential is *adapter.DeniedError, a bucket that does not
// exist *adapter.InvalidError, an unreachable server
// *adapter.UnavailableError.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, &adapter.InvalidError{Detail: "move: an S3 endpoint and bucket are required"}
	}
	cr := cfg.Credentials
	mc, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:     credentials.NewStaticV4(cr.AccessKeyID, cr.SecretAccessKey, cr.SessionToken),
		Secure:    cfg.Secure,
		Region:    cfg.Region,
		Transport: cfg.Transport,
		// Path-style requests: the S3-compatible servers a fleet runs
		// itself (SeaweedFS, MinIO) have no per-bucket host names.
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, &adapter.InvalidError{Detail: fmt.Sprintf("move: S3 endpoint %q: %v", cfg.Endpoint, err)}
	}
	s := &Store{mc: mc, bucket: cfg.Bucket, prefix: cfg.Prefix}
	ok, err := mc.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, s.classify("check bucket", err)
	}
	if !ok {
		return nil, &adapter.InvalidError{Detail: fmt.Sprintf("move: bucket %q does not exist", cfg.Bucket)}
	}
	return s, nil
}

// String names the bucket, never the credentials.
func (s *Store) String() string { return "s3 bucket " + s.bucket + "/" + s.prefix }

func (s *Store) key(parts ...string) string { return s.prefix + strings.Join(parts, "/") }

// partSize bounds the memory an upload of unknown length holds: the client
// buffers one part (the default for an unknown length is over 500 MiB).
const partSize = 16 << 20

// put uploads r (size -1: unknown, streamed in parts) to key.
func (s *Store) put(ctx context.Context, key string, r io.Reader, size int64, opts minio.PutObjectOptions) (minio.UploadInfo, error) {
	if size < 0 {
		opts.PartSize = partSize
	}
	info, err := s.mc.PutObject(ctx, s.bucket, key, r, size, opts)
	if err != nil {
		return info, s.classify("upload "+key, err)
	}
	return info, nil
}

// putJSON uploads v as key's JSON.
func (s *Store) putJSON(ctx context.Context, key string, v any, opts minio.PutObjectOptions) (minio.UploadInfo, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return minio.UploadInfo{}, fmt.Errorf("encode %s: %w", key, err)
	}
	opts.ContentType = "application/json"
	return s.put(ctx, key, bytes.NewReader(b), int64(len(b)), opts)
}

// errNoObject is returned (wrapped) when a key holds no object.
var errNoObject = errors.New("no such object")

// get opens key for reading; errNoObject when it holds none. The caller
// closes the object.
func (s *Store) get(ctx context.Context, key string) (*minio.Object, minio.ObjectInfo, error) {
	obj, err := s.mc.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, minio.ObjectInfo{}, s.classify("download "+key, err)
	}
	info, err := obj.Stat()
	if err != nil {
		obj.Close()
		return nil, info, s.classify("download "+key, err)
	}
	return obj, info, nil
}

// maxJSON bounds a manifest, route or lease object read into memory.
const maxJSON = 1 << 20

// getJSON reads key's JSON into v and returns its ETag. The client reads
// an object's body conditional on the ETag its first answer gave, so an
// object rewritten in between (a lease taken over) is precondition
// failed: read again.
func (s *Store) getJSON(ctx context.Context, key string, v any) (string, error) {
	for attempt := 0; ; attempt++ {
		etag, err := s.getJSONOnce(ctx, key, v)
		if errors.Is(err, errPrecondition) && attempt < 8 {
			continue
		}
		return etag, err
	}
}

func (s *Store) getJSONOnce(ctx context.Context, key string, v any) (string, error) {
	obj, info, err := s.get(ctx, key)
	if err != nil {
		return "", err
	}
	defer obj.Close()
	b, err := io.ReadAll(io.LimitReader(obj, maxJSON+1))
	if err != nil {
		return "", s.classify("download "+key, err)
	}
	if len(b) > maxJSON {
		return "", &adapter.InvalidError{Detail: fmt.Sprintf("move: %s is over %d bytes", key, maxJSON)}
	}
	if err := json.Unmarshal(b, v); err != nil {
		return "", &adapter.InvalidError{Detail: fmt.Sprintf("move: decode %s: %v", key, err)}
	}
	return info.ETag, nil
}

// remove deletes key; a key that holds nothing is no error.
func (s *Store) remove(ctx context.Context, key string) error {
	if err := s.mc.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		if err := s.classify("remove "+key, err); !errors.Is(err, errNoObject) {
			return err
		}
	}
	return nil
}

// errPrecondition is returned (wrapped) when a conditional write lost:
// the object exists (If-None-Match) or changed (If-Match).
var errPrecondition = errors.New("precondition failed")

// classify turns an S3 client error into the adapter's taxonomy, keeping
// the server's code. Credentials never appear in these errors: the
// client's messages name the access key's status, not the key.
func (s *Store) classify(op string, err error) error {
	er := minio.ToErrorResponse(err)
	switch er.Code {
	case "NoSuchKey", "NoSuchObject":
		return fmt.Errorf("move: %s: %w", op, errNoObject)
	case "PreconditionFailed", "ConditionalRequestConflict":
		return fmt.Errorf("move: %s: %w", op, errPrecondition)
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken":
		return &adapter.DeniedError{Detail: fmt.Sprintf("move: %s: %s: %s", op, er.Code, er.Message)}
	case "NoSuchBucket":
		return &adapter.InvalidError{Detail: fmt.Sprintf("move: %s: bucket %q does not exist", op, s.bucket)}
	case "":
		if er.StatusCode == http.StatusNotFound {
			return fmt.Errorf("move: %s: %w", op, errNoObject)
		}
		if er.StatusCode == http.StatusPreconditionFailed {
			return fmt.Errorf("move: %s: %w", op, errPrecondition)
		}
		return &adapter.UnavailableError{Detail: fmt.Sprintf("move: %s: %v", op, err)}
	}
	if er.StatusCode >= 500 || er.StatusCode == http.StatusTooManyRequests {
		return &adapter.UnavailableError{Detail: fmt.Sprintf("move: %s: %s: %s", op, er.Code, er.Message)}
	}
	return &adapter.ProviderError{Provider: "s3", Detail: fmt.Sprintf("move: %s: %s: %s", op, er.Code, er.Message)}
}
