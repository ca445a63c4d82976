package runlog

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Options configure an S3 store.
type S3Options struct {
	// Endpoint is the server's URL: http(s)://host[:port].
	Endpoint string
	Bucket   string
	// Prefix is put before each object key ("runs/" gives runs/<job>.log).
	Prefix    string
	Region    string
	AccessKey string
	SecretKey string
	// PathStyle addresses the bucket in the path rather than the host name.
	PathStyle bool
	// Timeout bounds each request.
	Timeout  time.Duration
	MaxBytes int64
}

// S3 keeps each log as an object "<prefix><escaped job id>.log" of a bucket
// on S3-compatible storage (AWS S3, MinIO, SeaweedFS, ...).
type S3 struct {
	client   *minio.Client
	bucket   string
	prefix   string
	timeout  time.Duration
	maxBytes int64
}

var _ Store = (*S3)(nil)

// metaTruncated is the user metadata key that marks a truncated log.
const metaTruncated = "Autoprov-Truncated"

// NewS3 connects to the storage and checks that the bucket exists.
func NewS3(ctx context.Context, o S3Options) (*S3, error) {
	u, err := url.Parse(o.Endpoint)
	if err != nil || u.Host == "" {
		return nil, errors.New("run logs: S3 endpoint must be a URL with a host")
	}
	lookup := minio.BucketLookupAuto
	if o.PathStyle {
		lookup = minio.BucketLookupPath
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	client, err := minio.New(u.Host, &minio.Options{
		Creds:        credentials.NewStaticV4(o.AccessKey, o.SecretKey, ""),
		Secure:       u.Scheme == "https",
		Region:       o.Region,
		BucketLookup: lookup,
		Transport:    tr,
	})
	if err != nil {
		return nil, fmt.Errorf("run logs: S3 client: %w", err)
	}
	s := &S3{client: client, bucket: o.Bucket, prefix: o.Prefix, timeout: o.Timeout, maxBytes: o.MaxBytes}
	cctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	ok, err := client.BucketExists(cctx, o.Bucket)
	if err != nil {
		return nil, fmt.Errorf("run logs: check S3 bucket %s: %w", o.Bucket, err)
	}
	if !ok {
		return nil, fmt.Errorf("run logs: S3 bucket %s does not exist", o.Bucket)
	}
	return s, nil
}

// Backend implements Store.
func (s *S3) Backend() string { return BackendS3 }

// maxKeyName is the longest escaped job id used as an object name as it
// is: S3 allows 1,024-byte keys, but servers that keep objects as files do
// not allow names longer than 255 bytes.
const maxKeyName = 200

// Key returns the object key of jobID's log: the job id, escaped, or for a
// long one "sha256-<hex of the job id>".
func (s *S3) Key(jobID string) string {
	name := url.PathEscape(jobID)
	if len(name) > maxKeyName {
		sum := sha256.Sum256([]byte(jobID))
		name = "sha256-" + hex.EncodeToString(sum[:])
	}
	return s.prefix + name + ".log"
}

// Put implements Store.
func (s *S3) Put(ctx context.Context, jobID string, r io.Reader) (Info, error) {
	data, truncated, err := capture(r, s.maxBytes)
	if err != nil {
		return Info{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	opts := minio.PutObjectOptions{ContentType: "text/plain; charset=utf-8"}
	if truncated {
		opts.UserMetadata = map[string]string{metaTruncated: "true"}
	}
	if _, err := s.client.PutObject(ctx, s.bucket, s.Key(jobID), bytes.NewReader(data), int64(len(data)), opts); err != nil {
		return Info{}, fmt.Errorf("store run log of %s: %w", jobID, err)
	}
	return Info{JobID: jobID, Size: int64(len(data)), Truncated: truncated, CreatedAt: time.Now()}, nil
}

// Open implements Store.
func (s *S3) Open(ctx context.Context, jobID string) (io.ReadCloser, Info, error) {
	sctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	st, err := s.client.StatObject(sctx, s.bucket, s.Key(jobID), minio.StatObjectOptions{})
	if err != nil {
		if minio.ToErrorResponse(err).StatusCode == http.StatusNotFound {
			return nil, Info{}, ErrNotFound
		}
		return nil, Info{}, fmt.Errorf("read run log of %s: %w", jobID, err)
	}
	obj, err := s.client.GetObject(ctx, s.bucket, s.Key(jobID), minio.GetObjectOptions{})
	if err != nil {
		return nil, Info{}, fmt.Errorf("read run log of %s: %w", jobID, err)
	}
	info := Info{JobID: jobID, Size: st.Size, CreatedAt: st.LastModified}
	for k, v := range st.UserMetadata {
		if strings.EqualFold(k, metaTruncated) && v == "true" {
			info.Truncated = true
		}
	}
	return obj, info, nil
}

// Delete implements Store.
func (s *S3) Delete(ctx context.Context, jobID string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.client.RemoveObject(ctx, s.bucket, s.Key(jobID), minio.RemoveObjectOptions{}); err != nil {
		if minio.ToErrorResponse(err).StatusCode == http.StatusNotFound {
			return nil
		}
		return fmt.Errorf("delete run log of %s: %w", jobID, err)
	}
	return nil
}

// DeleteBefore implements Store: it lists the prefix and removes the
// objects last modified before t. (A bucket lifecycle rule does the same
// server-side and may be used instead, with RUNLOG_RETENTION=0.)
func (s *S3) DeleteBefore(ctx context.Context, t time.Time) (int, error) {
	old := make(chan minio.ObjectInfo)
	var listErr error
	go func() {
		defer close(old)
		for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix, Recursive: true}) {
			if obj.Err != nil {
				listErr = obj.Err
				return
			}
			if strings.HasSuffix(obj.Key, ".log") && obj.LastModified.Before(t) {
				select {
				case old <- obj:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	n := 0
	var firstErr error
	for res := range s.client.RemoveObjectsWithResult(ctx, s.bucket, old, minio.RemoveObjectsOptions{}) {
		if res.Err != nil {
			if firstErr == nil {
				firstErr = res.Err
			}
			continue
		}
		n++
	}
	if listErr != nil {
		return n, fmt.Errorf("list old run logs: %w", listErr)
	}
	if firstErr != nil {
		return n, fmt.Errorf("delete old run logs: %w", firstErr)
	}
	return n, nil
}
