package ec2

import (
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

func bogusFilter() *ec2.DescribeInstancesInput {
	return &ec2.DescribeInstancesInput{Filters: []types.Filter{{Name: aws.String("bogus"), Values: []string{"x"}}}}
}
