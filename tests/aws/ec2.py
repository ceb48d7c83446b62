#!/usr/bin/env python3
"""The test's side of EC2 (a moto server): build the VPC and the node instances, read an
interface's addresses. Used by tests/aws_netns.rs.

  ec2.py setup ENDPOINT NAME=IP=TYPE...   -> JSON {name: {"instance": id, "interface": eni}}
  ec2.py addresses ENDPOINT ENI           -> the interface's addresses, space-separated
"""
import json
import sys

import boto3


def client(endpoint):
    return boto3.client(
        "ec2",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


def setup(endpoint, nodes):
    ec2 = client(endpoint)
    vpc = ec2.create_vpc(CidrBlock="198.19.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="198.19.0.0/25", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    out = {}
    for spec in nodes:
        name, ip, itype = spec.split("=")
        i = ec2.run_instances(
            ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType=itype, SubnetId=subnet, PrivateIpAddress=ip
        )["Instances"][0]
        out[name] = {"instance": i["InstanceId"], "interface": i["NetworkInterfaces"][0]["NetworkInterfaceId"]}
    print(json.dumps(out))


def addresses(endpoint, eni):
    n = client(endpoint).describe_network_interfaces(NetworkInterfaceIds=[eni])["NetworkInterfaces"][0]
    ips = [a["PrivateIpAddress"] for a in n["PrivateIpAddresses"]] + [a["Ipv6Address"] for a in n.get("Ipv6Addresses", [])]
    print(" ".join(ips))


if __name__ == "__main__":
    cmd, endpoint, *rest = sys.argv[1:]
    {"setup": lambda: setup(endpoint, rest), "addresses": lambda: addresses(endpoint, rest[0])}[cmd]()
