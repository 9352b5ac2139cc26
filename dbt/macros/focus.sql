{#- FOCUS 1.2 allowed values, copied from the specification
    (FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec, tag v1.2, specification/columns/). -#}

{#- ServiceCategory (servicecategory.md). -#}
{% macro focus_service_categories() -%}
('AI and Machine Learning', 'Analytics', 'Business Applications', 'Compute', 'Databases', 'Developer Tools', 'Identity', 'Integration', 'Internet of Things', 'Management and Governance', 'Media', 'Migration', 'Mobile', 'Multicloud', 'Networking', 'Security', 'Storage', 'Web', 'Other')
{%- endmacro %}

{#- (ServiceCategory, ServiceSubcategory) pairs (servicesubcategory.md): each subcategory
    has one parent category. -#}
{% macro focus_service_subcategories() -%}
(values
    ('AI and Machine Learning', 'AI Platforms'),
    ('AI and Machine Learning', 'Bots'),
    ('AI and Machine Learning', 'Generative AI'),
    ('AI and Machine Learning', 'Machine Learning'),
    ('AI and Machine Learning', 'Natural Language Processing'),
    ('AI and Machine Learning', 'Other (AI and Machine Learning)'),
    ('Analytics', 'Analytics Platforms'),
    ('Analytics', 'Business Intelligence'),
    ('Analytics', 'Data Processing'),
    ('Analytics', 'Search'),
    ('Analytics', 'Streaming Analytics'),
    ('Analytics', 'Other (Analytics)'),
    ('Business Applications', 'Productivity and Collaboration'),
    ('Business Applications', 'Other (Business Applications)'),
    ('Compute', 'Containers'),
    ('Compute', 'End User Computing'),
    ('Compute', 'Quantum Compute'),
    ('Compute', 'Serverless Compute'),
    ('Compute', 'Virtual Machines'),
    ('Compute', 'Other (Compute)'),
    ('Databases', 'Caching'),
    ('Databases', 'Data Warehouses'),
    ('Databases', 'Ledger Databases'),
    ('Databases', 'NoSQL Databases'),
    ('Databases', 'Relational Databases'),
    ('Databases', 'Time Series Databases'),
    ('Databases', 'Other (Databases)'),
    ('Developer Tools', 'Developer Platforms'),
    ('Developer Tools', 'Continuous Integration and Deployment'),
    ('Developer Tools', 'Development Environments'),
    ('Developer Tools', 'Source Code Management'),
    ('Developer Tools', 'Quality Assurance'),
    ('Developer Tools', 'Other (Developer Tools)'),
    ('Identity', 'Identity and Access Management'),
    ('Identity', 'Other (Identity)'),
    ('Integration', 'API Management'),
    ('Integration', 'Messaging'),
    ('Integration', 'Workflow Orchestration'),
    ('Integration', 'Other (Integration)'),
    ('Internet of Things', 'IoT Analytics'),
    ('Internet of Things', 'IoT Platforms'),
    ('Internet of Things', 'Other (Internet of Things)'),
    ('Management and Governance', 'Architecture'),
    ('Management and Governance', 'Compliance'),
    ('Management and Governance', 'Cost Management'),
    ('Management and Governance', 'Data Governance'),
    ('Management and Governance', 'Disaster Recovery'),
    ('Management and Governance', 'Endpoint Management'),
    ('Management and Governance', 'Observability'),
    ('Management and Governance', 'Support'),
    ('Management and Governance', 'Other (Management and Governance)'),
    ('Media', 'Content Creation'),
    ('Media', 'Gaming'),
    ('Media', 'Media Streaming'),
    ('Media', 'Mixed Reality'),
    ('Media', 'Other (Media)'),
    ('Migration', 'Data Migration'),
    ('Migration', 'Resource Migration'),
    ('Migration', 'Other (Migration)'),
    ('Mobile', 'Other (Mobile)'),
    ('Multicloud', 'Multicloud Integration'),
    ('Multicloud', 'Other (Multicloud)'),
    ('Networking', 'Application Networking'),
    ('Networking', 'Content Delivery'),
    ('Networking', 'Network Connectivity'),
    ('Networking', 'Network Infrastructure'),
    ('Networking', 'Network Routing'),
    ('Networking', 'Network Security'),
    ('Networking', 'Other (Networking)'),
    ('Security', 'Secret Management'),
    ('Security', 'Security Posture Management'),
    ('Security', 'Threat Detection and Response'),
    ('Security', 'Other (Security)'),
    ('Storage', 'Backup Storage'),
    ('Storage', 'Block Storage'),
    ('Storage', 'File Storage'),
    ('Storage', 'Object Storage'),
    ('Storage', 'Storage Platforms'),
    ('Storage', 'Other (Storage)'),
    ('Web', 'Application Platforms'),
    ('Web', 'Other (Web)'),
    ('Other', 'Other (Other)')
) as allowed(service_category, service_subcategory)
{%- endmacro %}

{#- The FOCUS 1.2 columns (columns.mdpp): a dataset's other columns must be x_ prefixed and
    come after these. -#}
{% macro focus_columns() -%}
{{ return(['AvailabilityZone', 'BilledCost', 'BillingAccountId', 'BillingAccountName', 'BillingAccountType',
          'BillingCurrency', 'BillingPeriodEnd', 'BillingPeriodStart', 'CapacityReservationId',
          'CapacityReservationStatus', 'ChargeCategory', 'ChargeClass', 'ChargeDescription',
          'ChargeFrequency', 'ChargePeriodEnd', 'ChargePeriodStart', 'CommitmentDiscountCategory',
          'CommitmentDiscountId', 'CommitmentDiscountName', 'CommitmentDiscountQuantity',
          'CommitmentDiscountStatus', 'CommitmentDiscountType', 'CommitmentDiscountUnit',
          'ConsumedQuantity', 'ConsumedUnit', 'ContractedCost', 'ContractedUnitPrice', 'EffectiveCost',
          'InvoiceId', 'InvoiceIssuerName', 'ListCost', 'ListUnitPrice', 'PricingCategory',
          'PricingCurrency', 'PricingCurrencyContractedUnitPrice', 'PricingCurrencyEffectiveCost',
          'PricingCurrencyListUnitPrice', 'PricingQuantity', 'PricingUnit', 'ProviderName',
          'PublisherName', 'RegionId', 'RegionName', 'ResourceId', 'ResourceName', 'ResourceType',
          'ServiceCategory', 'ServiceName', 'ServiceSubcategory', 'SkuId', 'SkuMeter',
          'SkuPriceDetails', 'SkuPriceId', 'SubAccountId', 'SubAccountName', 'SubAccountType', 'Tags']) }}
{%- endmacro %}

{#- Columns FOCUS 1.2 marks Mandatory (feature level), all present in focus_export. -#}
{% macro focus_mandatory_columns() -%}
{{ return(['BilledCost', 'BillingAccountId', 'BillingAccountName', 'BillingCurrency', 'BillingPeriodEnd',
          'BillingPeriodStart', 'ChargeCategory', 'ChargeClass', 'ChargeDescription', 'ChargePeriodEnd',
          'ChargePeriodStart', 'ContractedCost', 'EffectiveCost', 'InvoiceIssuerName', 'ListCost',
          'PricingQuantity', 'PricingUnit', 'ProviderName', 'PublisherName', 'ServiceCategory',
          'ServiceName']) }}
{%- endmacro %}

{#- A FOCUS rule as a dbt test: the rows of `model` that break it (`violation`, a SQL
    predicate), within the billing window (the rows this run wrote; every row without
    window vars). The test's name says which column and requirement it checks. -#}
{% test focus_rule(model, violation) -%}
select *
from {{ model }}
where {{ in_window('x_ChargeHourUtc') }}
  and ({{ violation }})
{%- endtest %}
