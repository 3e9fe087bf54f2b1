"""What a source checkpoint is: its format (the source-format table and detection), its families and expert names, grouping into projections, structure rules, draft layers."""
