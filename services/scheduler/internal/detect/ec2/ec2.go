// Package ec2 detects AWS EC2 instances (seed 000's AWS detector) with
// DescribeInstances through aws-sdk-go-v2: running instances with the
// configured tags, page by page. Tags become labels; the instance id is
// the handle (stable) and the provider id; the public or private address
// is used, as configured.
package ec2

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
)

// Source is the source name of EC2 instances.
const Source = "ec2"

// SSHUserTag is the tag that overrides the SSH user of an instance.
const SSHUserTag = "autoprov:ssh_user"

// ProjectsTag lists the projects that own an instance (project ids
// separated by commas or spaces). An instance without it has the owners an
// operator gives it; one whose tag holds anything but project ids is owned
// by no project (fleet-only) until the tag is fixed: a typo never widens
// who may reach a server.
const ProjectsTag = "autoprov:projects"

// Config configures the detector.
type Config struct {
	Region string
	// Endpoint overrides the EC2 endpoint (a VPC endpoint, a stand-in).
	Endpoint string
	// Tags filter the instances: every tag must have one of its values
	// ("*" for any value).
	Tags map[string][]string
	// Address is "public" or "private" (default public).
	Address string
	// SSHUser is the user instances are reached as (default admin, Debian's
	// AMIs), unless the instance's autoprov:ssh_user tag says otherwise.
	SSHUser string
	// AccessKeyID and SecretAccessKey, when set, are the credentials;
	// otherwise the SDK's default chain is used (environment, shared files,
	// instance role).
	AccessKeyID     string
	SecretAccessKey string
	// PageSize is MaxResults of each call (5-1000, default 1000).
	PageSize int32
	// MaxAttempts bounds the SDK's retries of one call (default 3).
	MaxAttempts int
}

// Detector lists EC2 instances.
type Detector struct {
	cfg    Config
	client *ec2.Client
}

// New returns a Detector.
func New(ctx context.Context, cfg Config) (*Detector, error) {
	if cfg.Region == "" {
		return nil, errors.New("ec2: region is required")
	}
	switch cfg.Address {
	case "":
		cfg.Address = "public"
	case "public", "private":
	default:
		return nil, fmt.Errorf("ec2: address must be public or private, not %q", cfg.Address)
	}
	if cfg.SSHUser == "" {
		cfg.SSHUser = "admin"
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = 1000
	}
	if cfg.PageSize < 5 || cfg.PageSize > 1000 {
		return nil, fmt.Errorf("ec2: page size %d not in 5..1000", cfg.PageSize)
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = 3
	}
	opts := []func(*config.LoadOptions) error{config.WithRegion(cfg.Region), config.WithRetryMaxAttempts(cfg.MaxAttempts)}
	if cfg.AccessKeyID != "" {
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, "")))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("ec2: load AWS configuration: %w", err)
	}
	client := ec2.NewFromConfig(awsCfg, func(o *ec2.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	})
	return &Detector{cfg: cfg, client: client}, nil
}

// Name is "ec2".
func (d *Detector) Name() string { return Source }

// Detect lists the running instances with the configured tags, page by
// page: a page's instances are yielded before the next page is read.
func (d *Detector) Detect(ctx context.Context, yield func(fleet.Detected) error) error {
	filters := []types.Filter{{Name: aws.String("instance-state-name"), Values: []string{"running"}}}
	keys := make([]string, 0, len(d.cfg.Tags))
	for k := range d.cfg.Tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		vals := d.cfg.Tags[k]
		if len(vals) == 0 || (len(vals) == 1 && vals[0] == "*") {
			filters = append(filters, types.Filter{Name: aws.String("tag-key"), Values: []string{k}})
			continue
		}
		filters = append(filters, types.Filter{Name: aws.String("tag:" + k), Values: vals})
	}
	p := ec2.NewDescribeInstancesPaginator(d.client, &ec2.DescribeInstancesInput{Filters: filters, MaxResults: aws.Int32(d.cfg.PageSize)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("ec2: describe instances: %w", err)
		}
		for _, r := range page.Reservations {
			for _, in := range r.Instances {
				if det, ok := d.server(in); ok {
					if err := yield(det); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

func (d *Detector) server(in types.Instance) (fleet.Detected, bool) {
	id := aws.ToString(in.InstanceId)
	addr := aws.ToString(in.PublicIpAddress)
	if d.cfg.Address == "private" {
		addr = aws.ToString(in.PrivateIpAddress)
	}
	if id == "" || addr == "" {
		return fleet.Detected{}, false // no address of the kind asked for: not reachable
	}
	labels := map[string]string{"ec2:instance_type": string(in.InstanceType)}
	if in.Placement != nil && in.Placement.AvailabilityZone != nil {
		labels["ec2:availability_zone"] = *in.Placement.AvailabilityZone
	}
	user := d.cfg.SSHUser
	var projects []string
	for _, t := range in.Tags {
		k, v := aws.ToString(t.Key), aws.ToString(t.Value)
		if k == SSHUserTag {
			user = v
			continue
		}
		if k == ProjectsTag {
			p, err := fleet.ParseProjects(v)
			if err != nil {
				p = []string{}
			}
			projects = p
			continue
		}
		if strings.HasPrefix(k, "aws:") {
			continue // AWS's own tags (aws:cloudformation:...)
		}
		labels[k] = v
	}
	return fleet.Detected{Handle: id, Address: addr, SSHUser: user, ProviderID: id, Labels: labels, Projects: projects}, true
}

// ParseTags parses "k=v1|v2,k2=*,k3" into a tag filter.
func ParseTags(s string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		k = strings.TrimSpace(k)
		if k == "" {
			return nil, fmt.Errorf("ec2 tag filter %q: empty tag key", part)
		}
		if !ok || v == "" {
			out[k] = []string{"*"}
			continue
		}
		out[k] = strings.Split(v, "|")
	}
	return out, nil
}
