package ec2

func bogusFilter() describeInput {
	return describeInput{Filters: []filter{{Name: "bogus", Values: []string{"x"}}}}
}
